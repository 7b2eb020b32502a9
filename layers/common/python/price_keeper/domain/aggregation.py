"""DailyTotal: the aggregator that folds usage shards into it, and reading it back.

Two triggers, one fold:

- **The usage table's DynamoDB Stream** (``fold_stream``; Lambda's event source mapping,
  batches within ``USAGE_STREAM.batching_window_s``). A batch names the shards its usage
  writes changed; the run sums every shard of just those labels (``0..agg_shard_count-1``,
  strongly consistent) and folds them. Totals move a second or two after a write, and a
  run's work is proportional to the labels it changed, not to the shards active that day.
- **The sweep** (``run``; EventBridge every 10 minutes). It repairs whatever the stream
  missed (a batch dropped after its retries, usage written before the stream existed):
  one Query of the sparse GSI ``active-by-day`` per org day in play (UTC today-2 ..
  today+1) finds the shards written that day, and all are folded. When the stream kept up
  it writes nothing but its heartbeat.

Folding (``_fold``), exactly once whatever runs overlap, repeat or arrive out of order:

1. Each label's shards summed per ``usage_key``/day; the DailyTotals whose sums changed are
   written conditional on ``requests`` growing. Sums only grow, so a stale or repeated run
   (Lambda delivers a stream batch at least once) never counts twice or moves a total back.
2. Each scope's ``{scope}#TOTAL`` (the sums over every label, and the set of labels summed,
   which aggregates and reports read): the run registers its labels in the set (``ADD``,
   only when missing), then reads the set and every label's total strongly consistent,
   sums and writes with the same condition. Every write ``ADD``s to the set, so it only
   grows; and every run registers and writes its labels before it reads, so the run that
   reads last sees every label's newest total: runs on different labels of one scope
   (different stream shards, the sweep) never lose each other's spend.
3. A heartbeat (time of the run, lag) that the aggregates endpoint reports as
   ``X-Data-Lag-Secs``: every sweep, and a stream run at most every ``HEARTBEAT_SECONDS``
   per container.

A run that fails half-way leaves totals that are each either old or new, never mixed; the
retried batch (or the next sweep) recomputes every sum from the shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import TYPE_CHECKING, NamedTuple

from ..cache import TTLCache
from ..config import get_config
from ..errors import ApiError
from ..observability import logger
from ..store import daily_totals, keys, tables, usage
from ..store.dynamo import batch_get_many
from ..timeutil import org_days_in_play, parse_day, utc_now
from . import orgs

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

SUM_FIELDS = usage.COUNTERS
HEARTBEAT_SECONDS = 10
_recent_heartbeat = TTLCache(HEARTBEAT_SECONDS)  # a stream run of this container wrote one lately


class StreamTrigger(NamedTuple):
    """How the usage table's stream invokes the aggregator (the CDK event source mapping
    and the local server's poller both follow it)."""

    batch_size: int
    batching_window_s: int
    retries: int  # then the batch goes to the aggregator's dead-letter queue; the sweep repairs it
    max_record_age_s: int


USAGE_STREAM = StreamTrigger(batch_size=1000, batching_window_s=1, retries=10, max_record_age_s=3600)
# Records worth a run: shard writes. Not the dedup items (date_key DEDUP), not deletions (TTL).
SHARD_WRITES = ("INSERT", "MODIFY")
USAGE_STREAM_FILTER = {
    "eventName": list(SHARD_WRITES),
    "dynamodb": {"Keys": {"date_key": {"S": [{"prefix": keys.day_key("")}]}}},
}


class Totals(NamedTuple):
    cost_usd_micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    requests: int = 0
    updated_at_epoch: int | None = None
    # The reservation ledger on the same item (``domain.reservations``): settled reserved
    # spend plus live holds, and the settled part.
    committed: int = 0
    settled: int = 0

    @classmethod
    def from_item(cls, item: dict | None) -> Totals:
        if not item:
            return cls()
        updated = item.get("updated_at_epoch")
        return cls(
            *(int(item.get(name, 0)) for name in SUM_FIELDS),
            updated_at_epoch=int(updated) if updated is not None else None,
            committed=int(item.get("committed", 0)),
            settled=int(item.get("settled", 0)),
        )

    @property
    def reserved(self) -> int:
        """Micro-USD held by live reservations (expired ones until a sweep ends them)."""
        return max(0, self.committed - self.settled)

    @property
    def unreserved(self) -> int:
        """Spend counted without a reservation, as far as the aggregation has folded it."""
        return max(0, self.cost_usd_micros - self.settled)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in SUM_FIELDS}


class DailyRead(NamedTuple):
    totals: dict[str, Totals]  # by usage_key; absent keys have no spend
    last_run_epoch: int | None  # when the aggregator last ran (only when asked for)
    labels: dict[str, frozenset[str]] = {}  # by scope total key: the labels it summed

    def of(self, usage_key: str) -> Totals:
        return self.totals.get(usage_key, Totals())

    @classmethod
    def from_items(cls, items: Iterable[dict]) -> DailyRead:
        totals, last_run, labels = {}, None, {}
        for item in items:
            if item["usage_key"] == keys.HEARTBEAT_KEY["usage_key"]:
                last_run = int(item["last_run_epoch"])
            else:
                totals[item["usage_key"]] = Totals.from_item(item)
                if "labels" in item:
                    labels[item["usage_key"]] = frozenset(item["labels"])
        return cls(totals, last_run, labels)


def read_daily_totals(
    usage_keys: Iterable[str], day: str, *, consistent: bool = False, include_heartbeat: bool = False
) -> DailyRead:
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
    # (usage_key, yyyymmdd, cost_usd_micros) of every label of every scope folded, and the labels this run changed
    costs: list[tuple[str, str, int]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)

    def changed_spends(self) -> dict[tuple[str, str], dict[str, int]]:
        """(scope, yyyymmdd) -> ``cost_usd_micros`` by label, for every scope/day with a
        total this run changed, in the order they changed, with every label of that
        scope/day in play (changed or not)."""
        spends: dict[tuple[str, str], dict[str, int]] = {
            (keys.split_usage_key(usage_key)[0], day): {} for usage_key, day in self.changed
        }
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

    def add(self, item: dict, updated_at: int) -> None:
        for name in SUM_FIELDS:
            self.sums[name] += int(item.get(name, 0))
        self.shard_updates.append(updated_at)


def changed_labels(records: Iterable[DynamoDBRecord]) -> set[tuple[str, str]]:
    """(usage_key, date_key) of every label whose shards a stream batch wrote; the records
    ``USAGE_STREAM_FILTER`` lets through, whatever else the batch holds."""
    changed = set()
    for record in records:
        item_keys = record.dynamodb.keys if record.dynamodb else {}
        date_key = item_keys.get("date_key")
        if (
            record.event_name
            and record.event_name.name in SHARD_WRITES
            and isinstance(date_key, str)
            and date_key.startswith(keys.day_key(""))
            and "shard_key" in item_keys
        ):
            changed.add((keys.usage_key_of_shard(item_keys["shard_key"]), date_key))
    return changed


def usage_expires_at(day: str) -> int:
    """TTL of an org day's shards and total: ``usage_retention_days`` after the day."""
    start = datetime.combine(parse_day(day), time(0), tzinfo=UTC)
    return int(start.timestamp()) + (get_config().metering.usage_retention_days + 1) * 86400


def _write_total(usage_key: str, date_key: str, group: _Group, now_epoch: int) -> bool:
    """Write a total unless a newer one (more requests) is already there; a scope total's
    labels are added to its set, never replace it."""
    values = {
        **group.sums,
        "updated_at_epoch": now_epoch,
        "source_updated_at_epoch": max(group.shard_updates),
        tables.TTL_ATTRIBUTE: usage_expires_at(keys.day_of_key(date_key)),
    }
    return daily_totals.write_if_grown(usage_key, date_key, values, group.labels)


def _fold_into(
    report: RunReport, usage_key: str, date_key: str, group: _Group, existing: dict | None, now_epoch: int
) -> bool:
    """Write one total when its sums changed; True when this run wrote it."""
    existing = existing or {}
    unchanged = "requests" in existing and all(int(existing.get(name, 0)) == group.sums[name] for name in SUM_FIELDS)
    if unchanged or not group.shard_updates:
        return False
    folded_until = int(existing.get("source_updated_at_epoch", 0))
    unfolded = [update for update in group.shard_updates if update > folded_until] or group.shard_updates
    report.lag_seconds = max(report.lag_seconds, now_epoch - min(unfolded))
    if _write_total(usage_key, date_key, group, now_epoch):
        report.totals_written += 1
        return True
    report.stale_puts_skipped += 1
    return False


def _fold_scope_totals(labels_by_scope: dict[tuple[str, str], set[str]], report: RunReport, now_epoch: int) -> None:
    """Step 2 of the fold for each (scope, date_key): register, read back, sum, write."""
    total_keys = {
        scope_day: {"usage_key": keys.scope_total_key(scope_day[0]), "date_key": scope_day[1]}
        for scope_day in labels_by_scope
    }
    current = daily_totals.read_current(total_keys.values(), consistent=True)
    summed: dict[tuple[str, str], set[str]] = {}
    for scope_day, labels in labels_by_scope.items():
        total_key = total_keys[scope_day]
        known = set(current.get((total_key["usage_key"], total_key["date_key"]), {}).get("labels", ()))
        summed[scope_day] = (
            known
            if labels <= known
            else daily_totals.register_labels(
                total_key, labels - known, usage_expires_at(keys.day_of_key(total_key["date_key"]))
            )
        )
    label_keys = [
        {"usage_key": keys.usage_key(scope, label), "date_key": date_key}
        for (scope, date_key), labels in summed.items()
        for label in labels
    ]
    label_totals = daily_totals.read_current(label_keys, consistent=True)
    for (scope, date_key), labels in summed.items():
        group = _Group(labels=labels)
        for label in labels:
            usage_key = keys.usage_key(scope, label)
            item = label_totals.get((usage_key, date_key))
            if item:  # (a label registered by a run that has not written its total yet)
                group.add(item, int(item.get("source_updated_at_epoch", 0)))
                report.costs.append((usage_key, keys.day_of_key(date_key), int(item["cost_usd_micros"])))
        total_key = total_keys[(scope, date_key)]
        _fold_into(
            report, total_key["usage_key"], date_key, group, current.get((total_key["usage_key"], date_key)), now_epoch
        )


def _fold(shard_keys: list[dict], consistent: bool, report: RunReport, now: datetime) -> None:
    """Fold every label whose shards are ``shard_keys`` (all of each label's shards); strongly
    consistent shard reads when the run must see the writes that triggered it."""
    now_epoch = int(now.timestamp())
    shards = usage.read_shards(shard_keys, [*SUM_FIELDS, "updated_at_epoch"], consistent=consistent)
    groups: dict[tuple[str, str], _Group] = {}
    for shard in shards:
        groups.setdefault((keys.usage_key_of_shard(shard["shard_key"]), shard["date_key"]), _Group()).add(
            shard, int(shard.get("updated_at_epoch", 0))
        )
    report.active_shards += len(shards)
    report.usage_keys += len(groups)
    current = daily_totals.read_current({"usage_key": u, "date_key": d} for u, d in groups)
    labels_by_scope: dict[tuple[str, str], set[str]] = {}
    for (usage_key, date_key), group in groups.items():
        if _fold_into(report, usage_key, date_key, group, current.get((usage_key, date_key)), now_epoch):
            report.changed.append((usage_key, keys.day_of_key(date_key)))
        scope, label = keys.split_usage_key(usage_key)
        labels_by_scope.setdefault((scope, date_key), set()).add(label)
    if labels_by_scope:
        _fold_scope_totals(labels_by_scope, report, now_epoch)


def _heartbeat(report: RunReport, now: datetime) -> None:
    daily_totals.put_heartbeat(int(now.timestamp()), report.lag_seconds)


def run(now: datetime | None = None) -> RunReport:
    """The sweep: fold every shard written on the org days in play."""
    now = now or utc_now()
    report = RunReport(days=[day.strftime("%Y%m%d") for day in org_days_in_play(now)])
    _fold([shard for day in report.days for shard in usage.active_shard_keys(day)], False, report, now)
    _heartbeat(report, now)
    return report


def fold_stream(records: Iterable[DynamoDBRecord], now: datetime | None = None) -> RunReport:
    """An event-driven run: fold the labels a stream batch changed, all of their shards."""
    now = now or utc_now()
    changed = changed_labels(records)
    report = RunReport(days=sorted({keys.day_of_key(date_key) for _, date_key in changed}))
    if not changed:
        return report
    shard_keys = []
    for usage_key, date_key in sorted(changed):
        scope, label = keys.split_usage_key(usage_key)
        try:
            shard_count = orgs.effective_config(keys.split_scope(scope)[0]).agg_shard_count  # the org's, immutable
        except ApiError as error:
            if error.status != 404:
                raise  # e.g. a throttled read: the batch is retried
            logger.warning("spend of an unregistered org left to the sweep", extra={"scope": scope})
            continue
        shard_keys += keys.shard_item_keys(scope, label, date_key, shard_count)
    if not shard_keys:
        return report
    _fold(shard_keys, True, report, now)
    if not _recent_heartbeat.get("written"):
        _heartbeat(report, now)
        _recent_heartbeat.put("written", True)
    return report
