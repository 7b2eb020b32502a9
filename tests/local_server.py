"""``python -m local`` in a subprocess, as a newcomer runs it: the one launcher every
end-to-end test uses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from local.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
READY_DEADLINE_SECONDS = 90
EVENTUALLY_SECONDS = 30
# Settings of the test process (moto endpoints, secret names) must not leak into the server.
_NOT_INHERITED = ("AWS_", "DYNAMODB_", "MOTO_", "JWT_SECRET_NAME", "PROVISIONING_SECRET_NAME")


@dataclass(frozen=True)
class Launched:
    process: subprocess.Popen
    base_url: str
    log: Path  # stdout and stderr


def launch(log_dir: Path, provisioning_key: str, *, own_process_group: bool = False, **settings: str) -> Launched:
    """A freshly started local server (in-memory, rate limits off, timers as ``settings``
    say), once it answers /health; in a process group of its own if asked (as ``make run``
    is in a terminal's), else in the tests' (so that it dies with them)."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith(_NOT_INHERITED)}
    env.update(
        PORT=str(port),
        PROVISIONING_API_KEY=provisioning_key,
        RATE_LIMITS="off",
        LOCAL_PERSIST="off",
        AGGREGATOR_INTERVAL_SECONDS="3600",
        PRICING_REFRESH_INTERVAL_SECONDS="0",
        BCRYPT_ROUNDS="4",
    )
    env.update(settings)
    log = Path(log_dir) / f"server-{port}.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "local"],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            process_group=0 if own_process_group else None,
        )
    launched = Launched(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_until_healthy(launched.base_url, process, log)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return launched


@contextlib.contextmanager
def local_server(log_dir: Path, provisioning_key: str, **settings: str):
    """Base URL of a freshly started local server (``launch``); SIGTERM and wait on exit."""
    process = (launched := launch(log_dir, provisioning_key, **settings)).process
    try:
        yield launched.base_url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def module_server(provisioning_key: str, **settings: str):
    """A module-scoped fixture: the base URL of one ``local_server`` for all of a module's
    tests (``base_url = module_server(KEY, ...)`` in the module)."""

    @pytest.fixture(scope="module")
    def base_url(tmp_path_factory):
        with local_server(tmp_path_factory.mktemp("server"), provisioning_key, **settings) as url:
            yield url

    return base_url


@contextlib.contextmanager
def reconciling_server(log_dir: Path, provisioning_key: str, tolerance_seconds: int = 5):
    """``local_server`` whose aggregator and reconciler run every second, with a late-report
    tolerance of 5 s (config.yaml's is 900 s): Bedrock's calls are reconciled within seconds."""
    config = log_dir / "config.yaml"
    text = (ROOT / "config.yaml").read_text()
    assert "tolerance_seconds: 900" in text
    config.write_text(text.replace("tolerance_seconds: 900", f"tolerance_seconds: {tolerance_seconds}"))
    with local_server(
        log_dir,
        provisioning_key,
        PRICE_KEEPER_CONFIG=str(config),
        AGGREGATOR_INTERVAL_SECONDS="1",
        RECONCILE_INTERVAL_SECONDS="1",
    ) as base_url:
        yield base_url


def eventually(check, what: str, seconds: float = EVENTUALLY_SECONDS):
    """``check()``'s first truthy result, polled while the server's timers (aggregator,
    reconciler) work: a wait with a deadline, not a timing check."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"never happened within {seconds} s: {what}"
        time.sleep(0.25)


def _wait_until_healthy(base_url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"local server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"local server not healthy after {READY_DEADLINE_SECONDS}s:\n{log.read_text()[-3000:]}")
