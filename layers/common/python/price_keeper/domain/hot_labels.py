"""Hot labels: a label-day's shard count grows with its load.

A label's usage of a day is spread over ``agg_shard_count`` shard items (the org's, 8 by
default). Concurrent transactions on one shard item cancel each other
(``TransactionConflict``), so a label written faster than a few hundred records a second
keeps conflicting. The writer that conflicts doubles the label-day's count (up to
``MAX_SHARDS``) in a count item beside the shards (``keys.shard_count_key``, one
conditional UpdateItem) and retries on a shard chosen among the new count; the same
request id, so the dedup item still makes it count once. The count only grows, and only
for that label and day.

Writers never read the item on the hot path: a container learns a count when it raises it
or when its own raise finds it raised already (the failed condition returns the item), and
keeps it for the day. A writer that has not learned it yet writes below it, which the fold
reads anyway. The fold reads the count item beside the shards (``aggregation._read``) and
then the shards above what it assumed, so a total is the sum of every shard ever written.
"""

from __future__ import annotations

from ..cache import TTLCache
from ..store import keys, usage

MAX_SHARDS = 64
_known = TTLCache(24 * 3600)  # (scope, label, yyyymmdd) -> the count this container learned


def shard_count(scope: str, label: str, day: str, default: int) -> int:
    """The shards a record of the label-day is spread over: the org's count until raised."""
    return max(default, _known.get((scope, label, day), 0))


def learned(scope: str, label: str, day: str, count: int) -> None:
    """Remember a label-day's count read or written elsewhere (it only grows)."""
    if count > _known.get((scope, label, day), 0):
        _known.put((scope, label, day), count)


def raise_after_conflict(scope: str, label: str, day: str, current: int, expires_at: int) -> int:
    """Double the label-day's count after a conflict on one of its shards (up to
    ``MAX_SHARDS``); the count to choose among now, the stored one if another writer
    raised it further."""
    if current >= MAX_SHARDS:
        return current
    stored = usage.raise_shard_count(
        keys.shard_count_key(scope, label, keys.day_key(day)), min(MAX_SHARDS, current * 2), expires_at
    )
    learned(scope, label, day, stored)
    return max(current, stored)
