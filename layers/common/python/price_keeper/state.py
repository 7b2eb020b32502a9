"""The process state of a warm Lambda container, in one registry.

Every module that keeps something between invocations (a client, a cache, a leased rate
allowance, a per-request context value) registers how to forget it with ``kept``; one
``reset`` then forgets everything, as a cold container would start (tests; the local
stack's reset). Nothing here is needed in production, where containers just end.
"""

from __future__ import annotations

from collections.abc import Callable

_resets: list[Callable[[], object]] = []


def kept(forget: Callable[[], object]) -> Callable[[], object]:
    """Register ``forget`` (no arguments) as the way to drop one piece of state."""
    _resets.append(forget)
    return forget


def reset() -> None:
    """Forget every piece of process state: the next call starts like a cold container."""
    for forget in _resets:
        forget()
