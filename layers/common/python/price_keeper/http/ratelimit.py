"""Per-client rate limits shared by every Lambda container, at a fraction of a DynamoDB
call per request.

Each limit is a fixed window counter in the StickyState table
(``RATE#{client}`` / ``LIMIT#{name}#{window_start}``, TTL two windows). A container does
not write per request: it *leases* a slice of the window's allowance with one conditional
``ADD`` (``used + n <= limit``) and spends it locally. Across all containers the window
can never admit more than ``limit`` requests; the cost is one write per slice
(``limit // LEASE_FRACTION``, at least 1), so the 1,000/min usage limit costs one write
per 50 requests. Near the limit the slice shrinks to 1, so small limits stay exact.

``consume(key, limit_name=...)`` counts one request where the caller is known: the request
pipeline with the route's limit (``routes.Route.rate_limit``) once it authenticated the
caller, the token endpoints with their own limits. ``refund`` gives back what was consumed:
the token endpoint charges a failed-attempts limit before it checks a secret and refunds it
when the secret was right. The ``X-RateLimit-*`` headers of the request's last charge are
kept for its response (``response_headers``; ``begin_request`` clears them).
"""

from __future__ import annotations

import math
import os
import threading
import time
from contextvars import ContextVar
from typing import NamedTuple

from .. import state
from ..config import RateLimit, get_config
from ..errors import ApiError
from ..store import rate_windows

LEASE_FRACTION = 20

_headers: ContextVar[dict | None] = ContextVar("rate_headers", default=None)
# (client, limit, window start) -> (leased requests not yet spent here, allowance not yet leased by anyone)
_local: dict[tuple[str, str, int], tuple[int, int]] = {}
state.kept(_local.clear)
state.kept(lambda: _headers.set(None))
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("RATE_LIMITS", "on").lower() not in ("off", "false", "0")


def begin_request() -> None:
    """Called by the API entry point at the start of each request."""
    _headers.set(None)


def response_headers() -> dict:
    """``X-RateLimit-*`` headers for the current request (empty when no limit applied)."""
    return _headers.get() or {}


class Window(NamedTuple):
    limit: RateLimit
    start: int

    @property
    def reset(self) -> int:
        return self.start + self.limit.per_seconds


def _window(limit: RateLimit, now: float) -> Window:
    return Window(limit, int(now // limit.per_seconds) * limit.per_seconds)


def _expiry(window: Window) -> int:
    return window.reset + window.limit.per_seconds


def _lease(client: str, window: Window, wanted: int) -> tuple[int, int]:
    """Take up to ``wanted`` requests of the window's allowance: (granted, used after)."""
    for size in dict.fromkeys((wanted, 1)):
        used = rate_windows.lease(client, window.limit.name, window.start, size, window.limit.requests, _expiry(window))
        if used is not None:
            return size, used
    return 0, window.limit.requests


def _unit(seconds: int) -> str:
    return {60: "minute", 3600: "hour", 86400: "day"}.get(seconds, f"{seconds} seconds")


class Charge(NamedTuple):
    """One request counted against a window (what ``refund`` gives back)."""

    client: str
    window: Window


def consume(client: str, now: float | None = None, *, limit_name: str | None) -> Charge | None:
    """Count one request of ``client`` against the limit ``limit_name``; 429 when spent.
    ``None`` when no limit applies (no name, or limits switched off)."""
    name = limit_name
    if name is None or not enabled():
        return None
    limit = get_config().rate_limits[name]
    now = time.time() if now is None else now
    window = _window(limit, now)
    key = (client, limit.name, window.start)
    with _lock:
        spare, unleased = _local.get(key, (0, limit.requests))
        if spare > 0:
            _local[key] = (spare - 1, unleased)
    if spare <= 0:
        granted, used = _lease(client, window, max(1, limit.requests // LEASE_FRACTION))
        if granted == 0:
            retry_after = max(1, math.ceil(window.reset - now))
            headers = _header_values(client, window, 0)
            headers["Retry-After"] = str(retry_after)
            raise ApiError(
                429,
                "RATE_LIMIT_EXCEEDED",
                f"Rate limit of {limit.requests} requests/{_unit(limit.per_seconds)} exceeded",
                headers=headers,
                retry_after=retry_after,
            )
        with _lock:
            _forget_old_windows(now)
            spare, unleased = _local.get(key, (0, 0))[0] + granted, limit.requests - used
            _local[key] = (spare - 1, unleased)
    _headers.set(_header_values(client, window, _local[key][0] + _local[key][1]))
    return Charge(client, window)


def refund(charge: Charge | None) -> None:
    """Give back one request counted by ``consume`` to every container (one ``ADD -1``
    on the window it was counted in, even if that window has ended since)."""
    if charge is None:
        return
    window = charge.window
    rate_windows.give_back(charge.client, window.limit.name, window.start, _expiry(window))
    headers = _headers.get()
    if headers and headers["X-RateLimit-ClientId"] == charge.client:
        _headers.set({**headers, "X-RateLimit-Remaining": str(int(headers["X-RateLimit-Remaining"]) + 1)})


def _header_values(client: str, window: Window, remaining: int) -> dict:
    return {
        "X-RateLimit-Limit": str(window.limit.requests),
        "X-RateLimit-Remaining": str(max(0, remaining)),
        "X-RateLimit-Reset": str(window.reset),
        "X-RateLimit-ClientId": client,
    }


def _forget_old_windows(now: float) -> None:
    stale = [key for key in _local if key[2] + get_config().rate_limits[key[1]].per_seconds < now]
    for key in stale:
        del _local[key]
