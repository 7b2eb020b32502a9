"""DailyTotal: the aggregator that folds usage shards into it, and reading it back.

Every run (EventBridge, once a minute):
1. Query the sparse GSI ``active-by-day`` for each org-local day still in play (UTC today-2
   .. today+1): the shard keys written on those days, and nothing else. Work grows with
   the scopes active on those days, never with all orgs ever created, and nothing scans.
2. BatchGetItem the shards (100 keys a call) and sum them per ``usage_key``/day, and per
   scope/day over every label (``{scope}#TOTAL``, with the set of labels that had spend):
   what the scope's total cap, aggregates and reports read, whatever the labels.
3. BatchGetItem the current DailyTotals and PutItem only the ones whose sums changed.
   The put is conditional on ``requests`` growing: sums only ever grow, so a slower,
   overlapping run can never move a total backwards.
4. Write a heartbeat item (time of the run, lag) that the aggregates endpoint reports as
   ``X-Data-Lag-Secs``.

A run that fails half-way leaves totals that are each either old or new, never mixed; the
next run recomputes every sum from the shards, so nothing needs repairing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, time, timezone
from typing import Iterable, NamedTuple

from . import keys, tables
from .config import get_config
from .store import daily_totals, usage
from .store.dynamo import batch_get_many
from .timeutil import org_days_in_play, parse_day, utc_now

SUM_FIELDS = usage.COUNTERS


class Totals(NamedTuple):
    cost_usd_micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    requests: int = 0
    updated_at_epoch: int | None = None

    @classmethod
    def from_item(cls, item: dict | None) -> "Totals":
        if not item:
            return cls()
        updated = item.get("updated_at_epoch")
        return cls(*(int(item.get(name, 0)) for name in SUM_FIELDS),
                   updated_at_epoch=int(updated) if updated is not None else None)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in SUM_FIELDS}


class DailyRead(NamedTuple):
    totals: dict[str, Totals]  # by usage_key; absent keys have no spend
    last_run_epoch: int | None  # when the aggregator last ran (only when asked for)
    labels: dict[str, frozenset[str]] = {}  # by scope total key: the labels it summed

    def of(self, usage_key: str) -> Totals:
        return self.totals.get(usage_key, Totals())

    @classmethod
    def from_items(cls, items: Iterable[dict]) -> "DailyRead":
        totals, last_run, labels = {}, None, {}
        for item in items:
            if item["usage_key"] == keys.HEARTBEAT_KEY["usage_key"]:
                last_run = int(item["last_run_epoch"])
            else:
                totals[item["usage_key"]] = Totals.from_item(item)
                if "labels" in item:
                    labels[item["usage_key"]] = frozenset(item["labels"])
        return cls(totals, last_run, labels)


def read_daily_totals(usage_keys: Iterable[str], day: str, *, consistent: bool = False,
                      include_heartbeat: bool = False) -> DailyRead:
    """DailyTotals of one org day in one BatchGetItem (more when over 100 keys)."""
    read = daily_totals.day_read(usage_keys, day, include_heartbeat=include_heartbeat)
    return DailyRead.from_items(batch_get_many([read], consistent=consistent)[0])


# --- the aggregator ----------------------------------------------------------------

@dataclass
class RunReport:
    days: list[str]
    active_shards: int = 0
    usage_keys: int = 0
    totals_written: int = 0
    stale_puts_skipped: int = 0
    lag_seconds: int = 0  # age of the oldest shard update this run folded (0: nothing new)
    # (usage_key, yyyymmdd, cost_usd_micros) of every total in play, and the ones this run changed
    costs: list[tuple[str, str, int]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)

    def changed_spends(self) -> dict[tuple[str, str], dict[str, int]]:
        """(scope, yyyymmdd) -> ``cost_usd_micros`` by label, for every scope/day with a
        total this run changed, in the order they changed, with every label of that
        scope/day in play (changed or not)."""
        spends: dict[tuple[str, str], dict[str, int]] = {
            (keys.split_usage_key(usage_key)[0], day): {} for usage_key, day in self.changed}
        for usage_key, day, cost in self.costs:
            scope, label = keys.split_usage_key(usage_key)
            if (scope, day) in spends:
                spends[(scope, day)][label] = cost
        return spends


@dataclass
class _Group:
    sums: dict = field(default_factory=lambda: dict.fromkeys(SUM_FIELDS, 0))
    shard_updates: list[int] = field(default_factory=list)
    labels: set[str] = field(default_factory=set)  # scope totals only: the labels summed


def fold(shards: Iterable[dict]) -> dict[tuple[str, str], _Group]:
    """Shard items summed per (usage_key, date_key)."""
    groups: dict[tuple[str, str], _Group] = {}
    for shard in shards:
        group = groups.setdefault((keys.usage_key_of_shard(shard["shard_key"]), shard["date_key"]), _Group())
        for name in SUM_FIELDS:
            group.sums[name] += int(shard.get(name, 0))
        group.shard_updates.append(int(shard.get("updated_at_epoch", 0)))
    return groups


def scope_totals(groups: dict[tuple[str, str], _Group]) -> dict[tuple[str, str], _Group]:
    """Label groups summed per (``{scope}#TOTAL``, date_key)."""
    totals: dict[tuple[str, str], _Group] = {}
    for (usage_key, date_key), group in groups.items():
        scope, label = keys.split_usage_key(usage_key)
        total = totals.setdefault((keys.scope_total_key(scope), date_key), _Group())
        for name in SUM_FIELDS:
            total.sums[name] += group.sums[name]
        total.shard_updates.extend(group.shard_updates)
        total.labels.add(label)
    return totals


def usage_expires_at(day: str) -> int:
    """TTL of an org day's shards and total: ``usage_retention_days`` after the day."""
    start = datetime.combine(parse_day(day), time(0), tzinfo=timezone.utc)
    return int(start.timestamp()) + (get_config().metering.usage_retention_days + 1) * 86400


def _put_total(usage_key: str, date_key: str, group: _Group, now_epoch: int) -> bool:
    """Write a total unless a newer one (more requests) is already there."""
    item = {"usage_key": usage_key, "date_key": date_key, **group.sums, "updated_at_epoch": now_epoch,
            "source_updated_at_epoch": max(group.shard_updates),
            tables.TTL_ATTRIBUTE: usage_expires_at(keys.day_of_key(date_key))}
    if group.labels:
        item["labels"] = group.labels
    return daily_totals.put_if_grown(item)


def _fold_into(report: RunReport, usage_key: str, date_key: str, group: _Group, current: dict,
               now_epoch: int) -> bool:
    """Write one total when its sums changed; True when this run wrote it."""
    existing = current.get((usage_key, date_key), {})
    if existing and all(int(existing.get(name, 0)) == group.sums[name] for name in SUM_FIELDS):
        return False
    folded_until = int(existing.get("source_updated_at_epoch", 0))
    unfolded = [update for update in group.shard_updates if update > folded_until] or group.shard_updates
    report.lag_seconds = max(report.lag_seconds, now_epoch - min(unfolded))
    if _put_total(usage_key, date_key, group, now_epoch):
        report.totals_written += 1
        return True
    report.stale_puts_skipped += 1
    return False


def run(now: datetime | None = None) -> RunReport:
    now = now or utc_now()
    now_epoch = int(now.timestamp())
    report = RunReport(days=[day.strftime("%Y%m%d") for day in org_days_in_play(now)])
    shard_keys = [shard for day in report.days for shard in usage.active_shard_keys(day)]
    report.active_shards = len(shard_keys)
    groups = fold(usage.read_shards(shard_keys, [*SUM_FIELDS, "updated_at_epoch"]))
    report.usage_keys = len(groups)
    totals = scope_totals(groups)
    current = daily_totals.read_current([*groups, *totals])
    for (usage_key, date_key), group in groups.items():
        report.costs.append((usage_key, keys.day_of_key(date_key), group.sums["cost_usd_micros"]))
        if _fold_into(report, usage_key, date_key, group, current, now_epoch):
            report.changed.append((usage_key, keys.day_of_key(date_key)))
    for (usage_key, date_key), group in totals.items():
        _fold_into(report, usage_key, date_key, group, current, now_epoch)
    daily_totals.put_heartbeat(now_epoch, report.lag_seconds)
    return report
