"""The audit trail: one structured log line per provisioning request, whatever its outcome.

Every route with ``Route.audit`` (org and app PUT, rotation, revoke-tokens, boosts, voids) logs,
after its response is built (``api.lambda_entry``)::

    {"message": "audit", "action": "app.put", "outcome": "succeeded|refused|failed",
     "status": 201, "error": "<error code, refusals and failures only>",
     "actor": "key:1a2b3c4d", "authenticated": true, "org_id": "...", "app_id": "...",
     "source_ip": "...", ...facts the layer noted (e.g. boost_id)}

``actor`` identifies the presented ``X-API-Key`` without revealing it (the first 8 hex
digits of its SHA-256; ``null`` when none was sent); ``authenticated`` says whether it was
the provisioning key. Refusals before the key is checked (a malformed body) are logged
too, with ``authenticated: false``. The line is INFO on a logger of its own whose level is
fixed, so an operational log level of WARNING does not silence the trail.
"""

from __future__ import annotations

import hashlib
import json
from contextvars import ContextVar

from aws_lambda_powertools import Logger

from . import state
from .observability import SERVICE

KEY_ID_CHARS = 8
ID_MAX_CHARS = 100  # path ids are logged before or without validation: cut short

_logger = Logger(service=SERVICE, child=True, level="INFO")
_facts: ContextVar[dict | None] = ContextVar("audit_facts", default=None)
state.kept(lambda: _facts.set(None))


def key_id(presented: str) -> str:
    return "key:" + hashlib.sha256(presented.encode()).hexdigest()[:KEY_ID_CHARS]


def begin() -> None:
    """Called at the start of each invocation: no facts carried over from the last one."""
    _facts.set({})


def note(**facts) -> None:
    """Add facts to the current request's audit line (never secrets)."""
    current = _facts.get()
    if current is not None:
        current.update(facts)


def _header(event: dict, name: str) -> str | None:
    return next((value for key, value in (event.get("headers") or {}).items() if key.lower() == name.lower()), None)


def _error_code(response: dict) -> str | None:
    try:
        return json.loads(response.get("body") or "{}").get("error")
    except (ValueError, AttributeError):
        return None


def record(action: str, event: dict, response: dict, source_ip: str) -> None:
    """Log the audit line of a finished request from ``source_ip``."""
    status = int(response.get("statusCode", 500))
    facts = _facts.get() or {}
    presented = _header(event, "X-API-Key")
    line = {
        "action": action,
        "outcome": "succeeded" if status < 400 else "refused" if status < 500 else "failed",
        "status": status,
        "actor": key_id(presented) if presented else None,
        "authenticated": bool(facts.pop("authenticated", False)),
        **{name: str(value)[:ID_MAX_CHARS] for name, value in (event.get("pathParameters") or {}).items()},
        "source_ip": source_ip,
        **facts,
    }
    if status >= 400:
        line["error"] = _error_code(response)
    _logger.info("audit", extra=line)
