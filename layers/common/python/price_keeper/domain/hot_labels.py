"""Hot labels: a label-day's shard count grows with its load.

A label's usage of a day starts on one shard item (orgs created since adaptive shards, and
older orgs from config.yaml's ``metering.one_shard_from``: ``EffectiveConfig.starting_shards``;
before that day older orgs start on their ``agg_shard_count``, as their label-days always
did). Concurrent transactions on one shard item cancel each other (``TransactionConflict``).
The writer that conflicts spreads the label-day: a quiet one (one shard) to the org's
``agg_shard_count`` (8 by default), and from there it doubles the count (up to
``MAX_SHARDS``), in a count item beside the shards (``keys.shard_count_key``, one
conditional UpdateItem), and retries on a shard chosen among the new count; the same request
id, so the dedup item still makes it count once. The count only grows, and only for that
label and day.

So a quiet label-day (most of them, at fleet shape: a label reported every few minutes)
costs its fold two strongly consistent reads (its one shard and the count item) instead
of ``agg_shard_count`` + 1, and a busy one pays one raise on its first conflict.

Writers never read the item on the hot path: a container learns a count when it raises it
or when its own raise finds it raised already (the failed condition returns the item), and
keeps it for the day. A writer that has not learned it yet writes below it, which the fold
reads anyway. The fold reads the count item beside the shards (``aggregation._read``) and
then the shards above what it assumed, so a total is the sum of every shard ever written.
"""

from __future__ import annotations

from ..cache import TTLCache
from ..store import keys, usage

QUIET_SHARDS = 1  # what a new org's label-days start on (``first_shard_count``)
MAX_SHARDS = 64
_known = TTLCache(24 * 3600)  # (scope, label, yyyymmdd) -> the count this container learned


def shard_count(scope: str, label: str, day: str, first: int) -> int:
    """The shards a record of the label-day is spread over: the org's ``first`` count until raised."""
    return max(first, _known.get((scope, label, day), 0))


def learned(scope: str, label: str, day: str, count: int) -> None:
    """Remember a label-day's count read or written elsewhere (it only grows)."""
    if count > _known.get((scope, label, day), 0):
        _known.put((scope, label, day), count)


def raise_after_conflict(scope: str, label: str, day: str, current: int, busy: int, expires_at: int) -> int:
    """Spread the label-day after a conflict on one of its shards: to the org's ``busy``
    count (``agg_shard_count``) when it has fewer, else twice ``current`` (up to
    ``MAX_SHARDS``); the count to choose among now, the stored one if another writer raised
    it further."""
    if current >= MAX_SHARDS:
        return current
    stored = usage.raise_shard_count(
        keys.shard_count_key(scope, label, keys.day_key(day)), min(MAX_SHARDS, max(busy, current * 2)), expires_at
    )
    learned(scope, label, day, stored)
    return max(current, stored)
