"""The API docs (GET /docs) in a real browser: headless Chromium against the local server
renders every operation of the served OpenAPI document with Swagger UI, and asks nothing of
any host but the server (no CDN: the page works offline).

The browser is ``tests/browser.py``'s, which skips this test, saying why, without Chromium.
"""

from __future__ import annotations

import pytest
import requests

# selenium after tests.browser, which skips this module, saying why, where it is missing
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import WAIT_SECONDS, Browser
from tests.local_server import local_server

pytestmark = pytest.mark.e2e

KEY = "e2e-docs-provisioning-key"
OPERATIONS_SCRIPT = """return [...document.querySelectorAll('#swagger-ui .opblock')].map(block => [
    block.querySelector('.opblock-summary-method').textContent.toLowerCase(),
    block.querySelector('.opblock-summary-path').dataset.path])"""


def test_swagger_ui_renders_every_operation_from_the_server_alone(tmp_path):
    with local_server(tmp_path, KEY) as base_url, Browser(tmp_path) as browser:
        document = requests.get(f"{base_url}/openapi.json", timeout=10).json()
        operations = sorted([method, path] for path, methods in document["paths"].items() for method in methods)
        assert len(operations) >= 10

        browser.open(f"{base_url}/docs")
        WebDriverWait(browser.driver, WAIT_SECONDS).until(
            lambda _: len(browser.js(OPERATIONS_SCRIPT)) >= len(operations)
        )
        assert sorted(browser.js(OPERATIONS_SCRIPT)) == operations
        assert browser.js("return document.querySelector('#swagger-ui .info .title').textContent").startswith(
            document["info"]["title"]
        )
        browser.screenshot("docs")

        assert [request["url"] for request in browser.requests_sent()][:1] == [f"{base_url}/docs"]
        assert browser.requests_elsewhere(base_url) == []
        # The browser's own favicon request is the one 404: the page names no icon.
        assert [error for error in browser.errors() if "/favicon.ico " not in error["message"]] == []
