"""GET /console through the real docs function: one self-contained page (its CSS and JS
inline, nothing fetched from elsewhere), a Content-Security-Policy that allows exactly those
blocks, and a sign-in form that cannot leak a secret. The page in a browser:
tests/test_console_browser.py."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

from price_keeper import routes
from price_keeper.http import console

PAGE_BUDGET_BYTES = 64_000  # one Lambda response, no build step: keep it small (measured: ~43 KB)


def _policy(reply) -> dict[str, list[str]]:
    return {
        name: values
        for name, *values in (directive.split() for directive in reply.headers["content-security-policy"].split(";"))
    }


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _elements(html: str) -> list[tuple[str, dict]]:
    parser = _Elements()
    parser.feed(html)
    return parser.tags


def test_console_route_is_served_by_the_docs_function():
    route, params = routes.match("GET", "/console")
    assert (route.function, params) == ("docs", {})
    assert routes.match("POST", "/console") is None


def test_console_is_one_html_page_with_its_css_and_js_inline(api):
    reply = api.get("/console")
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    html = reply.text
    assert len(html.encode()) < PAGE_BUDGET_BYTES
    assert html.startswith("<!doctype html>") and "<!-- console." not in html
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert scripts == [(console.HERE / "console.js").read_text()]
    assert styles == [(console.HERE / "console.css").read_text()]
    # Nothing is loaded from anywhere: no src, no stylesheet link, no URL but the SVG namespace.
    for tag, attrs in _elements(html):
        assert "src" not in attrs, tag
        if tag == "link":
            assert attrs == {"rel": "icon", "href": "data:,"}
    assert set(re.findall(r"https?://[^\s\"'<>`]+", html)) == {"http://www.w3.org/2000/svg"}
    assert "cdn" not in html.lower()


def test_policy_allows_exactly_the_inline_blocks_and_this_origin(api):
    reply = api.get("/console")
    policy = _policy(reply)
    (script,) = re.findall(r"<script>(.*?)</script>", reply.text, re.S)
    (style,) = re.findall(r"<style>(.*?)</style>", reply.text, re.S)
    assert policy == {
        "default-src": ["'none'"],
        "script-src": [_sha256(script)],
        "style-src": [_sha256(style)],
        "connect-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "base-uri": ["'none'"],
        "form-action": ["'none'"],
        "frame-ancestors": ["'none'"],
    }
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["referrer-policy"] == "no-referrer"
    assert "unsafe" not in reply.headers["content-security-policy"]


def test_sign_in_form_has_labelled_client_credential_fields(api):
    elements = _elements(api.get("/console").text)
    forms = [attrs for tag, attrs in elements if tag == "form"]
    assert forms == [  # no action, never GET
        {"id": "sign-in-form", "method": "post", "novalidate": None},
        {"id": "reconciliation-form", "method": "post", "novalidate": None},
    ]
    inputs = {attrs["name"]: attrs for tag, attrs in elements if tag == "input"}
    assert set(inputs) == {"client_id", "client_secret", "provisioning_key", "recon_date"}
    assert inputs["client_secret"]["type"] == "password"
    labelled = {attrs["for"] for tag, attrs in elements if tag == "label"}
    assert {attrs["id"] for attrs in inputs.values()} <= labelled
    assert ("button", {"type": "submit", "id": "sign-in-button"}) in elements
    live = [attrs for tag, attrs in elements if "aria-live" in attrs]
    assert {attrs.get("role") for attrs in live} == {"status", "alert"}
    assert [attrs for tag, attrs in elements if attrs.get("id") == "history"]
    assert ("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}) in elements


def test_script_keeps_tokens_in_memory_and_never_writes_html():
    script = (console.HERE / "console.js").read_text()
    for api in (
        "localStorage",
        "sessionStorage",
        "document.cookie",
        "indexedDB",
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
    ):
        assert api not in script, api
    # Every request goes through one fetch helper, with credentials in headers and JSON bodies only.
    assert script.count("fetch(") == 1
    assert "credentials: 'omit'" in script and "Authorization = `Bearer ${s.access}`" in script
    for path in ("auth/token", "auth/refresh", "auth/revoke"):
        assert f"call('{path}', {{" in script, path


def test_operator_view_asks_for_the_key_as_a_secret_and_a_day():
    """Issue 24.3: the reconciliation in the console. The key is a password field that is never
    autofilled, it goes in the X-API-Key header through the one fetch helper, and the table has a
    column per number of the reply and a row per model."""
    html = (console.HERE / "console.html").read_text()
    elements = _elements(html)
    inputs = {attrs["name"]: attrs for tag, attrs in elements if tag == "input"}
    assert inputs["provisioning_key"]["type"] == "password"
    assert inputs["provisioning_key"]["autocomplete"] == "off"
    assert inputs["recon_date"]["type"] == "date"
    assert ("button", {"type": "submit", "id": "reconcile-button"}) in elements
    assert ("div", {"id": "recon-error", "class": "error", "role": "alert", "aria-live": "assertive"}) in elements
    table = html[html.index('<table id="reconciliation"') : html.index("</table>", html.index('id="reconciliation"'))]
    headers = re.findall(r'<th scope="col"[^>]*>([^<]+)</th>', table)
    assert headers == [
        "Model",
        "Bedrock calls",
        "Bedrock input",
        "Bedrock output",
        "Metered calls",
        "Metered input",
        "Metered output",
        "Unmetered input",
        "Unmetered output",
        "Unmetered cost",
    ]
    script = (console.HERE / "console.js").read_text()
    assert "headers['X-API-Key'] = apiKey" in script
    assert "call(`api/v1/reconciliation?date=${enc(day)}&page=${page}`, { auth: false, apiKey: key })" in script
    assert "if (page + 1 >= reply.data.pages) break;" in script  # every page of the day, then one table
    assert "'data-model': m.model_id" in script
    # The key is read from the field, kept in the closure, and the field emptied once it worked.
    assert "operatorKey = key;\n    keyInput.value = '';" in script
    assert "console.log" not in script


def test_page_is_built_once_per_container():
    assert console.page() is console.page()


def test_the_page_states_the_lag_the_docs_state():
    """Totals are folded from the usage table's stream within seconds (docs/api.md): the page
    must not tell its reader they lag by up to a minute."""
    script = (console.HERE / "console.js").read_text()
    docs = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    assert "Totals lag usage by a second or two" in docs
    assert "(totals lag usage by a second or two)" in script
    assert "minute)" not in script
