"""The spend console (``GET /console``): one static page for operators and app owners.

``console.html`` names its stylesheet and script with ``<!-- console.css -->`` and
``<!-- console.js -->``; they are inlined here, so the page is one response with no other
request but the API calls it makes to its own origin. The Content-Security-Policy allows
exactly those two inline blocks (by their SHA-256), fetches to this origin only, and no
form submission (the sign-in form is sent by the script as JSON, and the operator view's
provisioning key as ``X-API-Key``, so a secret can never end up in a URL or a form post, even
with the script blocked).
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
CONTENT_TYPE = "text/html; charset=utf-8"


class Page(NamedTuple):
    html: str
    headers: dict[str, str]


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _inline(html: str, marker: str, tag: str, text: str) -> str:
    placeholder = f"<!-- {marker} -->"
    if html.count(placeholder) != 1:
        raise ValueError(f"console.html must name {marker} exactly once")
    if f"</{tag}" in text.lower():
        raise ValueError(f"{marker} must not contain </{tag}")
    return html.replace(placeholder, f"<{tag}>{text}</{tag}>")


@lru_cache(maxsize=1)
def page() -> Page:
    """The page and its response headers (built once per container)."""
    style = (HERE / "console.css").read_text(encoding="utf-8")
    script = (HERE / "console.js").read_text(encoding="utf-8")
    html = (HERE / "console.html").read_text(encoding="utf-8")
    html = _inline(_inline(html, "console.css", "style", style), "console.js", "script", script)
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_digest(script)}",
            f"style-src {_digest(style)}",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return Page(
        html,
        {
            "Content-Security-Policy": policy,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
