"""Headless Chromium for the browser tests, driven by Selenium, with every DevTools network
event kept: what the page asked for, from where, and what came back.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them where apt-get
exists) and selenium. Importing this module without them skips the importing test module,
saying what is missing. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
WAIT_SECONDS = 30  # a deadline for things to happen (aggregation, page loads), never a measurement
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the browser tests need selenium (pip install -r requirements-dev.txt)"
)
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "the browser tests need Debian's chromium and chromium-driver "
        "(apt-get install -y chromium chromium-driver); not found: "
        + ", ".join(name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not path),
        allow_module_level=True,
    )


class Browser:
    """Headless Chromium with its DevTools network events kept for the whole test; a context
    manager that quits it."""

    def __init__(self, downloads: Path):
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        self.profile = tempfile.mkdtemp(prefix="test-chromium-")
        options.add_argument(f"--user-data-dir={self.profile}")
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        self.driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
        self.driver.execute_cdp_cmd("Network.enable", {})
        self.driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
        )
        self.events: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)

    def open(self, url: str) -> None:
        """Navigate to ``url``, keeping the network events from here on (not the blank start page's)."""
        self.network()
        self.events.clear()
        self.driver.get(url)

    def network(self) -> list[dict]:
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"].startswith("Network."):
                self.events.append(message)
        return self.events

    def requests_sent(self) -> list[dict]:
        return [
            e["params"]["request"] | {"id": e["params"]["requestId"]}
            for e in self.network()
            if e["method"] == "Network.requestWillBeSent"
        ]

    def requests_elsewhere(self, base_url: str) -> list[str]:
        """URLs the page asked for anywhere but ``base_url`` (its blobs and data: URLs are its own)."""
        return [
            request["url"]
            for request in self.requests_sent()
            if not request["url"].startswith((f"{base_url}/", f"blob:{base_url}/", "data:"))
        ]

    def responses(self, path: str) -> list[dict]:
        return [
            e["params"] | {"id": e["params"]["requestId"]}
            for e in self.network()
            if e["method"] == "Network.responseReceived" and e["params"]["response"]["url"].split("?")[0].endswith(path)
        ]

    def body(self, request_id: str) -> str:
        return self.driver.execute_cdp_cmd("Network.getResponseBody", {"requestId": request_id})["body"]

    def errors(self) -> list[dict]:
        """The console's SEVERE entries: script errors, CSP violations, failed loads."""
        return [entry for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def screenshot(self, name: str) -> Path:
        """The whole page (beyond the viewport) as ``test-artifacts/<name>.png``."""
        ARTIFACTS.mkdir(exist_ok=True)
        width, height = self.js("return [document.documentElement.clientWidth, document.documentElement.scrollHeight]")
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        path = ARTIFACTS / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
