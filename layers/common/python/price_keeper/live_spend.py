"""Live spend: a scope's spend per label summed from the usage shards themselves.

DailyTotal lags the shards by up to one aggregation interval (60 s). Near a quota that
lag is what a burst overspends, so in tight mode model selection and the usage response
can read the N shards of each label instead: one BatchGetItem of labels x shards
(100 keys a call, e.g. 3 labels x 8 shards = 24 keys, ~12 read units eventually
consistent at <= 4 KB a shard, vs 1.5 for the DailyTotals). ``benchmarks/overshoot.py``
measures what it buys.
"""
from __future__ import annotations

from typing import Iterable

from . import keys, tables
from .storage import batch_get


def live_spend(scope: str, labels: Iterable[str], day: str, shard_count: int) -> dict[str, int]:
    """``cost_usd_micros`` of each label for org-local ``day`` (``yyyymmdd``), summed over its
    ``shard_count`` shards; 0 for a label with no shard written yet.

    For model selection in tight mode: pass ``config.scope``, ``config.model_ordering``,
    the day and ``config.agg_shard_count``, and use the result as the spends.
    """
    labels = list(labels)
    wanted = [key for label in labels for key in keys.shard_item_keys(scope, label, keys.day_key(day), shard_count)]
    spends = dict.fromkeys(labels, 0)
    for item in batch_get(tables.USAGE_AGG_SHARDED, wanted, attributes=["cost_usd_micros"]):
        label = keys.usage_key_of_shard(item["shard_key"]).removeprefix(f"{scope}#LABEL#")
        spends[label] += int(item.get("cost_usd_micros", 0))
    return spends
