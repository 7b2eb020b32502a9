"""CORS with ``corsOrigins`` set, in a real browser: a page of an allowed origin calls the local
server (with ``CORS_ORIGINS``, what the stack gives every function) and reads its answers,
refusals included; a page of another origin is blocked by the browser.

The browser is ``tests/browser.py``'s, which skips this test, saying why, without Chromium.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.browser import Browser
from tests.local_server import local_server
from tests.provisioned import ORG_BODY

pytestmark = pytest.mark.e2e

KEY = "e2e-cors-provisioning-key"
# fetch() from the page; the preflight of a PUT with X-API-Key must pass before the request is sent.
FETCH_SCRIPT = """const [url, method, headers, body, done] = arguments;
fetch(url, {method, headers, body}).then(
    async reply => done({status: reply.status, body: await reply.json()}),
    error => done({blocked: String(error)}))"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self):
        page = b"<!doctype html><title>another origin</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass


@pytest.fixture
def origin_server():
    """Port of a server of plain pages: the origin a browser application would be served from."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_allowed_origin_reads_answers_and_refusals_and_another_is_blocked(tmp_path, origin_server):
    allowed = f"http://127.0.0.1:{origin_server}"
    with (
        local_server(tmp_path, KEY, CORS_ORIGINS=f"https://a.example,{allowed}") as base_url,
        Browser(tmp_path) as browser,
    ):
        org_url = f"{base_url}/api/v1/orgs/{uuid.uuid4()}"

        def fetch(method: str, url: str, headers: dict, body: str | None = None) -> dict:
            browser.driver.set_script_timeout(30)
            return browser.driver.execute_async_script(FETCH_SCRIPT, url, method, headers, body)

        browser.open(f"{allowed}/")
        json_key = {"Content-Type": "application/json", "X-API-Key": KEY}
        created = fetch("PUT", org_url, json_key, json.dumps(ORG_BODY))
        assert created["status"] == 201, created
        assert created["body"]["credentials"]["client_id"]
        # A refusal of the request pipeline, before any resolver: readable too.
        refused = fetch("PUT", org_url, {**json_key, "X-API-Key": "wrong"}, json.dumps(ORG_BODY))
        assert refused["status"] == 401 and refused["body"]["error"] == "UNAUTHORIZED", refused
        assert fetch("GET", f"{base_url}/health", {})["status"] == 200

        browser.open(f"http://localhost:{origin_server}/")  # the same page from an origin not allowed
        blocked = fetch("GET", f"{base_url}/health", {})
        assert "blocked" in blocked, blocked
