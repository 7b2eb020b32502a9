"""Per-client rate limits shared by every Lambda container, at a fraction of a DynamoDB
call per request, that never refuse a client under half its limit however many containers
serve it, and never admit more than the limit.

Each limit is a fixed window counter in the StickyState table
(``RATE#{client}`` / ``LIMIT#{name}#{window_start}``, TTL two windows). A container does
not write per request: it *leases* part of the window's allowance with one conditional
``ADD`` (``used + n <= limit``) and spends it locally. Every admitted request is covered
by the counter before it is admitted, so across all containers a window never admits more
than ``limit``.

What a container leases but does not spend is stranded there until the window ends, so a
lease is never larger than what the container has already admitted for that client in the
window (1, 1, 2, 4, ... up to ``limit // LEASE_FRACTION``), nor than half of what was left
when it last leased. Then the counter is at most twice the requests admitted, and a
client that has sent fewer than half its limit always finds room: a refusal needs the
counter at the limit. When a lease does not fit, the container takes what is left (the
refused write returns the counter), down to exactly one request; only a counter at the
limit refuses. Cost: about log2(r) + r / (limit / 20) writes for r requests of one client
in one container and window (a container serving 1,000 usage requests a minute: 32
writes, one per 31 requests). A container that finds a window full refuses that client
without a write for ``FULL_RECHECK_SECONDS``: a client flooding past its limit costs each
container a write a second, not one per refusal.

``consume(key, limit_name=...)`` counts one request where the caller is known: the request
pipeline with the route's limit (``routes.Route.rate_limit``) once it authenticated the
caller, the token endpoints with their own limits. An org may raise or lower the
requests of its clients' limits (``requests=``, from the org's ``rate_limits``). ``refund``
gives back what was consumed: the token endpoint charges a failed-attempts limit before it
checks a secret and refunds it when the secret was right. The ``X-RateLimit-*`` headers of
the request's last charge are kept for its response (``response_headers``;
``begin_request`` clears them).
"""

from __future__ import annotations

import math
import os
import threading
import time
from contextvars import ContextVar
from typing import NamedTuple

from . import routes, state
from .config import RateLimit, get_config
from .errors import ApiError
from .store import rate_windows

LEASE_FRACTION = 20  # the largest lease: this fraction of the limit
# A window found full is refused locally this long (at most until it ends) before its counter
# is tried again: only a refund (``refund``) lowers a counter, so a flood of refused requests
# costs a container one conditional write a second, not one each.
FULL_RECHECK_SECONDS = 1.0
MAX_ORG_REQUESTS = 1_000_000  # the most requests per window an org may set for its clients
# The limits counted per app or org client (the Bearer routes'): an org may set their requests.
ORG_ADJUSTABLE = frozenset(
    route.rate_limit for route in routes.ROUTES if route.auth in (routes.Auth.BEARER, routes.Auth.BEARER_ANY)
) - {None}


class Held(NamedTuple):
    """One client's window as this container knows it."""

    spare: int  # leased here, not yet spent
    spent: int  # admitted here in this window
    used: int  # the window's shared counter after this container's last lease
    reset: int  # the window's end
    refused_until: float = 0  # found full: refused here without a write until then...
    refused_at: int = 0  # ...unless the limit is now above the requests it was found full at


_headers: ContextVar[dict | None] = ContextVar("rate_headers", default=None)
_local: dict[tuple[str, str, int], Held] = {}  # (client, limit, window start) -> Held
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


def lease_size(requests: int, held: Held) -> int:
    """The next lease: no more than this container has admitted in the window (what it
    strands is then never more than what it used), half of what was left when it last
    leased, and ``requests // LEASE_FRACTION``; at least 1."""
    return max(1, min(requests // LEASE_FRACTION, held.spent, (requests - held.used) // 2))


def _lease(client: str, window: Window, wanted: int) -> tuple[int, int]:
    """Take up to ``wanted`` requests of the window's allowance: (granted, counter after).
    A refused lease returns the counter; the next try asks for what is left, so only a
    counter at the limit refuses (each try is smaller, so this ends)."""
    limit, size = window.limit.requests, wanted
    while size > 0:
        granted, used = rate_windows.lease(client, window.limit.name, window.start, size, limit, _expiry(window))
        if granted:
            return size, used
        size = min(size - 1, limit - used)
    return 0, limit


def _unit(seconds: int) -> str:
    return {60: "minute", 3600: "hour", 86400: "day"}.get(seconds, f"{seconds} seconds")


class Charge(NamedTuple):
    """One request counted against a window (what ``refund`` gives back)."""

    client: str
    window: Window


def consume(
    client: str,
    now: float | None = None,
    *,
    limit_name: str | None,
    requests: int | None = None,
    headers: bool = True,
    refundable: bool = False,
) -> Charge | None:
    """Count one request of ``client`` against the limit ``limit_name`` (its requests per
    window ``requests`` when given: an org's own limit); 429 when spent. ``None`` when no
    limit applies (no name, or limits switched off). ``headers=False``: a charge beside the
    request's own, whose ``X-RateLimit-*`` headers it leaves as they are. ``refundable``: the
    caller may ``refund`` it, from any container, so a window found full is never refused
    here without reading the counter again."""
    if limit_name is None or not enabled():
        return None
    limit = get_config().rate_limits[limit_name]
    if requests is not None:
        limit = limit._replace(requests=requests)
    now = time.time() if now is None else now
    window = _window(limit, now)
    key = (client, limit.name, window.start)
    with _lock:
        held = _local.get(key) or Held(0, 0, 0, window.reset)
        local = held.spare > 0 and held.used <= limit.requests  # (a spare leased under a limit since lowered: dropped)
        if local:
            held = _local[key] = held._replace(spare=held.spare - 1, spent=held.spent + 1)
    if not local:
        if not refundable and held.refused_until > now and held.refused_at >= limit.requests:
            _refuse(client, window, now)  # (unless an org raised its limit meanwhile)
        granted, used = _lease(client, window, lease_size(limit.requests, held))
        if granted == 0:
            with _lock:
                _local[key] = held._replace(
                    refused_until=min(window.reset, now + FULL_RECHECK_SECONDS), refused_at=limit.requests
                )
            _refuse(client, window, now)
        with _lock:
            _forget_old_windows(now)
            held = _local.get(key) or Held(0, 0, 0, window.reset)
            held = _local[key] = Held(held.spare + granted - 1, held.spent + 1, max(used, held.used), window.reset)
    if headers:
        _headers.set(_header_values(client, window, limit.requests - held.used + held.spare))
    return Charge(client, window)


def _refuse(client: str, window: Window, now: float) -> None:
    retry_after = max(1, math.ceil(window.reset - now))
    headers = _header_values(client, window, 0)
    headers["Retry-After"] = str(retry_after)
    limit = window.limit
    raise ApiError(
        429,
        "RATE_LIMIT_EXCEEDED",
        f"Rate limit of {limit.requests} requests/{_unit(limit.per_seconds)} exceeded",
        headers=headers,
        retry_after=retry_after,
    )


def refund(charge: Charge | None) -> None:
    """Give back one request counted by ``consume`` to every container (one ``ADD -1``
    on the window it was counted in, even if that window has ended since)."""
    if charge is None:
        return
    window = charge.window
    rate_windows.give_back(charge.client, window.limit.name, window.start, _expiry(window))
    key = (charge.client, window.limit.name, window.start)
    with _lock:
        held = _local.get(key)
        if held:
            _local[key] = held._replace(spent=max(0, held.spent - 1), used=held.used - 1)
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
    for key in [key for key, held in _local.items() if held.reset < now]:
        del _local[key]
