"""A tiny per-process TTL cache for warm Lambda containers (config, prices, revocation checks).

cachetools would do the same, but this is 20 lines and keeps the layer free of another
dependency on every cold start.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import state

_MISSING = object()


class TTLCache:
    def __init__(self, ttl_seconds: float, max_entries: int = 10_000):
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        self._data: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        state.kept(self.clear)

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._data.get(key)
        if entry is None or entry[0] < time.monotonic():
            return default
        return entry[1]

    def put(self, key: Any, value: Any, ttl_seconds: float | None = None) -> None:
        """Keep ``value``; when full, the entry put longest ago makes room (a container that
        serves more tenants than the bound keeps its recent ones warm, not none)."""
        with self._lock:
            self._data.pop(key, None)
            if len(self._data) >= self.max_entries:
                del self._data[next(iter(self._data))]
            self._data[key] = (time.monotonic() + (self.ttl if ttl_seconds is None else ttl_seconds), value)

    def get_or_load(self, key: Any, load: Callable[[], Any]) -> Any:
        return self.get_or_load_many([key], lambda _: {key: load()})[key]

    def get_or_load_many(self, keys: Iterable[Any], load: Callable[[list], dict]) -> dict:
        """The value of each of ``keys``; those not held are loaded together (``load(missing)``
        gives a value for each: one read for many keys, not one a key) and kept."""
        held = {key: self.get(key, _MISSING) for key in keys}
        missing = [key for key, value in held.items() if value is _MISSING]
        if missing:
            loaded = load(missing)
            for key in missing:
                self.put(key, loaded[key])
                held[key] = loaded[key]
        return held

    def discard(self, key: Any) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def etag(*parts) -> str:
    """A strong HTTP ETag of a reply's parts (JSON values): equal parts, equal tag."""
    digest = hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=8).hexdigest()
    return f'"{digest}"'
