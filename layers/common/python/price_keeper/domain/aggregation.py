"""DailyTotal: what the aggregator writes (``domain.ledger``'s fold), reading it back, and the hourly audit.

A label total holds a label-day's sums; a scope total the sums of the labels config.yaml does not name (registered
profiles), which it lists. A scope's spend of a day is its scope total plus each config label's total
(``scope_usage_keys``). Label totals keep hour marks for reconciliation. The audit re-evaluates the alerts of every
active scope-day of today, so a level-triggered alert two concurrent folds both missed still fires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import NamedTuple

from ..cache import TTLCache
from ..config import get_config
from ..store import daily_totals, keys, sticky, tables, usage
from ..store import reconciliation as reconciliation_store
from ..store.dynamo import batch_get_many
from ..timeutil import org_day, org_days_in_play, parse_day
from . import orgs
from .orgs import EffectiveConfig

# what re-pricing, voids and settlements add, folded too
SUM_FIELDS = (*usage.COUNTERS, usage.CORRECTIONS, usage.VOIDS, usage.SETTLED)
HEARTBEAT_SECONDS = 10
_recent_heartbeat = TTLCache(HEARTBEAT_SECONDS)  # a stream run of this container wrote one lately


class StreamTrigger(NamedTuple):
    """How the usage stream invokes the aggregator (CDK and the local poller): a failed batch is
    delivered again from the first record its reply names, one batch at a time per shard."""

    batch_size: int
    batching_window_s: int
    tumbling_window_s: int  # stateless: only a windowed event names its stream shard (``shardId``)


USAGE_STREAM = StreamTrigger(batch_size=1000, batching_window_s=1, tumbling_window_s=900)


# Records worth a run: the markers' inserts and updates (not TTL deletions or other items).
USAGE_STREAM_FILTERS = (
    {"eventName": ["INSERT", "MODIFY"], "dynamodb": {"Keys": {"date_key": {"S": [{"prefix": keys.MARKER_PREFIX}]}}}},
)


class Totals(NamedTuple):
    cost_usd_micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    requests: int = 0
    repriced: int = 0  # usage.CORRECTIONS
    voids: int = 0  # usage.VOIDS
    settled_usd_micros: int = 0  # usage.SETTLED: of ``cost_usd_micros``, what settled a reservation
    updated_at_epoch: int | None = None
    # The reservation ledger (an item of its own): settled reserved spend plus live holds, and the settled part.
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
        )

    @property
    def reserved(self) -> int:
        """Micro-USD held by live reservations (expired ones until a sweep ends them)."""
        return max(0, self.committed - self.settled)

    @property
    def unreserved(self) -> int:
        """Folded spend counted without a reservation: the folded cost less the settled spend the
        fold has counted (a settlement reaches the ledger at once, the folded cost later)."""
        return max(0, self.cost_usd_micros - self.settled_usd_micros)

    def plus(self, others: Iterable[Totals]) -> Totals:
        """These totals with the sums of ``others`` added (the ledger stays this one's)."""
        others = list(others)
        updated = [t.updated_at_epoch for t in [self, *others] if t.updated_at_epoch is not None]
        return self._replace(
            **{name: getattr(self, name) + sum(getattr(t, name) for t in others) for name in SUM_FIELDS},
            updated_at_epoch=max(updated, default=None),
        )


def scope_usage_keys(scope: str) -> list[str]:
    """The DailyTotal keys whose sum is ``scope``'s spend on a day: its scope total and each config
    label's total (bounded by config.yaml, never by registered profiles)."""
    return [keys.scope_total_key(scope), *(keys.usage_key(scope, label) for label in orgs.config_labels_ever())]


def scope_totals(scope: str, of: Callable[[str], Totals]) -> Totals:
    """``scope``'s totals over every label on a day, from ``of`` each ``scope_usage_keys`` key."""
    total_key, *apart = scope_usage_keys(scope)
    return of(total_key).plus(of(key) for key in apart)


class DailyRead(NamedTuple):
    totals: dict[str, Totals]  # by usage_key; absent keys have no spend
    last_run_epoch: int | None  # when the aggregator last ran (only when asked for)
    items: dict[str, dict] = {}  # by usage_key: the items read

    def of(self, usage_key: str) -> Totals:
        return self.totals.get(usage_key, Totals())

    def listed_apart(self, scope: str, labels: Iterable[str]) -> bool:
        """Whether the scope's spent-label items name a label other than ``labels`` that day."""
        item = self.items.get(keys.scope_total_key(scope))
        held = {label: self.items[key] for label in labels if (key := keys.usage_key(scope, label)) in self.items}
        return item is not None and daily_totals.lists_apart_beyond(item, held, orgs.config_labels_ever())

    @property
    def reserving(self) -> bool:
        """Whether a scope read has reservation ledgers that day (``daily_totals.RESERVING``)."""
        return any(daily_totals.RESERVING in item for item in self.items.values())

    @classmethod
    def from_items(cls, items: Iterable[dict]) -> DailyRead:
        """From DailyTotal items of one org day: totals, ledger items and the heartbeat."""
        items = list(items)
        totals, last_run, read = {}, None, {}
        for item in items:
            if item["usage_key"] == keys.HEARTBEAT_KEY["usage_key"]:
                last_run = int(item["last_run_epoch"])
            elif item["date_key"].startswith(keys.day_key("")):
                totals[item["usage_key"]] = Totals.from_item(item)
                read[item["usage_key"]] = item
        for item in items:
            if item["date_key"].startswith(keys.ledger_day_key("")):
                ledger = {name: int(item.get(name, 0)) for name in daily_totals.LEDGER}
                totals[item["usage_key"]] = totals.get(item["usage_key"], Totals())._replace(**ledger)
        return cls(totals, last_run, read)

    def with_ledgers(self, usage_keys: Iterable[str], day: str) -> DailyRead:
        if not self.reserving:
            return self
        ledgers = batch_get_many([daily_totals.ledger_read(usage_keys, day)])[0]
        return self.from_items([*self.items.values(), *ledgers])._replace(last_run_epoch=self.last_run_epoch)


def read_daily_totals(
    usage_keys: Iterable[str],
    day: str,
    *,
    consistent: bool = False,
    include_heartbeat: bool = False,
    ledgers: bool = False,
) -> DailyRead:
    """DailyTotals of one org day in one BatchGetItem (with ``ledgers``, their reservation ledgers)."""
    read = daily_totals.day_read(usage_keys, day, include_heartbeat=include_heartbeat, ledgers=ledgers)
    return DailyRead.from_items(batch_get_many([read], consistent=consistent)[0])


@dataclass
class RunReport:
    days: list[str]
    totals_written: int = 0
    lag_seconds: int = 0  # age of the oldest record this run folded (0: nothing new)
    # (usage_key, yyyymmdd, cost_usd_micros) of the labels alerts need, and the labels changed
    costs: list[tuple[str, str, int]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    evaluated: list[tuple[str, str]] = field(default_factory=list)  # (scope, yyyymmdd) whose alerts run
    # (scope, yyyymmdd) -> the scope's cost over every label, and its sticky labels passed
    scope_costs: dict[tuple[str, str], int] = field(default_factory=dict)
    sticky: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def evaluated_spends(self) -> dict[tuple[str, str], dict[str, int]]:
        """(scope, yyyymmdd) -> ``cost_usd_micros`` by label, for each ``evaluated`` scope-day."""
        spends: dict[tuple[str, str], dict[str, int]] = {scope_day: {} for scope_day in self.evaluated}
        for usage_key, day, cost in self.costs:
            scope, label = keys.split_usage_key(usage_key)
            if (scope, day) in spends:
                spends[(scope, day)][label] = cost
        return spends

    def scope_cost(self, scope: str, day: str, spends: dict[str, int]) -> int:
        """The scope's cost over every label (``spends`` summed when the run did not say)."""
        return self.scope_costs.get((scope, day), sum(spends.values()))

    def merge(self, other: RunReport) -> None:
        self.days = sorted({*self.days, *other.days})
        self.totals_written += other.totals_written
        self.lag_seconds = max(self.lag_seconds, other.lag_seconds)
        self.costs += other.costs
        self.changed += other.changed
        self.evaluated += other.evaluated
        self.scope_costs.update(other.scope_costs)
        self.sticky.update(other.sticky)


def usage_expires_at(day: str) -> int:
    """TTL of an org day's totals: ``usage_retention_days`` after the day."""
    start = datetime.combine(parse_day(day), time(0), tzinfo=UTC)
    return int(start.timestamp()) + (get_config().metering.usage_retention_days + 1) * 86400


FOLD_ATTEMPTS = 6  # per chunk, when a write failed for another reason than a concurrent fold

LabelDay = tuple[str, str]  # (usage_key, date_key)


class Snapshot(NamedTuple):
    """What one read of a fold found: totals by key, sticky labels."""

    totals: dict[tuple[str, str], dict]
    sticky: dict[tuple[str, str], frozenset[str]]


class ScopeDay(NamedTuple):
    scope: str
    date_key: str
    label_days: list[LabelDay]
    config: EffectiveConfig | None  # for alerts: the ordering's totals and the sticky label

    @property
    def total_key(self) -> dict:
        return {"usage_key": keys.scope_total_key(self.scope), "date_key": self.date_key}

    def in_scope_total(self, label: str) -> bool:
        """Whether the scope total counts ``label``: not a config label (``orgs.config_labels_ever``)."""
        return label not in orgs.config_labels_ever()

    def is_today(self, now: datetime) -> bool:
        """The scope's org-local day is this scope-day's (the day its config's quotas are for)."""
        return self.config is not None and org_day(self.config.timezone, now) == keys.day_of_key(self.date_key)

    def alert_label_days(self) -> list[LabelDay]:
        """The label totals alerts evaluate beside the moved ones: the ordering's and every config label's."""
        ordering = self.config.model_ordering if self.config else ()
        labels = dict.fromkeys([*ordering, *orgs.config_labels_ever()])
        return [(keys.usage_key(self.scope, label), self.date_key) for label in labels]


def read_for_fold(scope_days: list[ScopeDay], fresh_totals: bool = False) -> Snapshot:
    """One BatchGetItem of everything a fold of ``scope_days`` needs (totals and sticky labels). Eventually consistent
    unless ``fresh_totals``: a stale total only fails the conditional write, and the retry reads fresh."""
    total_keys = {
        (usage_key, date_key)
        for scope_day in scope_days
        for usage_key, date_key in [*scope_day.label_days, *scope_day.alert_label_days()]
    } | {(scope_day.total_key["usage_key"], scope_day.date_key) for scope_day in scope_days}
    sticky_days = [
        (scope_day.scope, keys.day_of_key(scope_day.date_key))
        for scope_day in scope_days
        if scope_day.config and scope_day.config.sticky_fallback_enabled
    ]
    reads = [
        daily_totals.fold_read({"usage_key": u, "date_key": d} for u, d in total_keys),
        sticky.days_read(sticky_days),
    ]
    totals, sticky_items = batch_get_many(reads, consistent=fresh_totals)
    passed = {(item["scope_key"], item["date_key"]): frozenset(item.get("passed_labels", ())) for item in sticky_items}
    sticky_keys = {scope_day: keys.sticky_key(*scope_day) for scope_day in sticky_days}
    return Snapshot(
        {(item["usage_key"], item["date_key"]): item for item in totals},
        {
            scope_day: passed.get((key["scope_key"], key["date_key"]), frozenset())
            for scope_day, key in sticky_keys.items()
        },
    )


class Move(NamedTuple):
    """A label total a fold moves, by how much, and whether this first fold lists its label."""

    fold: daily_totals.LabelFold
    difference: dict[str, int]
    listed: bool

    @property
    def label(self) -> str:
        return keys.split_usage_key(self.fold.usage_key)[1]


def report_moved(
    report: RunReport, scope_day: ScopeDay, snapshot: Snapshot, folded: list[Move], scope_cost: int
) -> None:
    """Add to ``report`` what alerts need after a scope-day's fold: moved labels, costs, scope cost, sticky labels."""
    day = keys.day_of_key(scope_day.date_key)
    costs = {move.fold.usage_key: move.fold.values["cost_usd_micros"] for move in folded}
    for usage_key, date_key in scope_day.alert_label_days():
        costs.setdefault(usage_key, int((snapshot.totals.get((usage_key, date_key)) or {}).get("cost_usd_micros", 0)))
    report.changed += [(move.fold.usage_key, day) for move in folded]
    report.evaluated.append((scope_day.scope, day))
    report.costs += [(usage_key, day, cost) for usage_key, cost in costs.items()]
    report.scope_costs[(scope_day.scope, day)] = scope_cost + sum(  # their costs are all in ``costs``
        costs[keys.usage_key(scope_day.scope, label)] for label in orgs.config_labels_ever()
    )
    if (scope_day.scope, day) in snapshot.sticky:
        report.sticky[(scope_day.scope, day)] = snapshot.sticky[(scope_day.scope, day)]


def label_move(
    scope_day: ScopeDay,
    label_day: LabelDay,
    stored: dict,
    sums: dict,
    source_updated_at: int,
    now: datetime,
    marks: bytes | None = None,
) -> Move:
    """A label total's move from ``stored`` to ``sums``: conditional on ``stored``'s progress, with ``marks`` (else
    ``stored``'s with this UTC hour's mark), and listed for the scope-day when it is the label-day's first."""
    day = keys.day_of_key(scope_day.date_key)
    values = {
        **sums,
        "updated_at_epoch": int(now.timestamp()),
        "source_updated_at_epoch": source_updated_at,
        tables.TTL_ATTRIBUTE: usage_expires_at(day),
        # its sums as of this UTC hour, beside those of the hours before (domain.reconciliation)
        keys.HOUR_MARKS: marks if marks is not None else reconciliation_store.with_mark(stored, now, sums),
    }
    first = "requests" not in stored
    fold = daily_totals.LabelFold(*label_day, values, None if first else daily_totals.progress_fields(stored))
    difference = {name: sums[name] - int(stored.get(name, 0)) for name in SUM_FIELDS}
    label = keys.split_usage_key(label_day[0])[1]
    # a label the scope total leaves apart is never listed: readers read them all
    return Move(fold, difference, first and scope_day.in_scope_total(label))


def scope_day_actions(scope_day: ScopeDay, moves: list[Move], now: datetime) -> list[dict]:
    """One scope-day's writes for ``moves``: the label totals the scope total leaves apart alone, the others with the
    scope total's ADD and their listings, and the index entry of each label-day's first total (``usage.day_listed``)."""
    day = keys.day_of_key(scope_day.date_key)
    actions = [daily_totals.label_total_action(m.fold) for m in moves if not scope_day.in_scope_total(m.label)]
    together = [m for m in moves if scope_day.in_scope_total(m.label)]
    if together:  # one transaction: their label totals, their differences added to the scope total
        actions += daily_totals.fold_scope_actions(
            scope_day.scope,
            scope_day.date_key,
            [m.fold for m in together],
            {name: sum(m.difference[name] for m in together) for name in SUM_FIELDS},
            {
                "updated_at_epoch": int(now.timestamp()),
                "source_updated_at_epoch": max(m.fold.values["source_updated_at_epoch"] for m in together),
                tables.TTL_ATTRIBUTE: usage_expires_at(day),
            },
            [m.label for m in together if m.listed],
        )
    return actions + [
        usage.day_listed(scope_day.scope, m.label, day, int(now.timestamp()), usage_expires_at(day))
        for m in moves
        if m.fold.read_progress is None
    ]


def configs_of(scopes: Iterable[str]) -> dict[str, EffectiveConfig]:
    """Each scope's effective config, read together (unregistered ones left out)."""
    configs = orgs.effective_configs({keys.split_scope(scope) for scope in scopes})
    return {scope: configs[pair] for scope in scopes if (pair := keys.split_scope(scope)) in configs}


def heartbeat(lag_seconds: int, now: datetime) -> None:
    """What ``X-Data-Lag-Secs`` reports: when the aggregator last ran, and its lag then."""
    daily_totals.put_heartbeat(int(now.timestamp()), lag_seconds)


def stream_heartbeat(lag_seconds: int, now: datetime) -> None:
    """The heartbeat of a stream run: at most every ``HEARTBEAT_SECONDS`` a container."""
    if not _recent_heartbeat.get("written"):
        heartbeat(lag_seconds, now)
        _recent_heartbeat.put("written", True)


def days_in_play(now: datetime) -> list[str]:
    """The org days (``yyyymmdd``) that can still receive usage somewhere: UTC today-2 .. today+1."""
    return [day.strftime("%Y%m%d") for day in org_days_in_play(now)]


def scope_days_of(label_days: Iterable[LabelDay], configs: dict[str, EffectiveConfig]) -> list[ScopeDay]:
    by_scope_day: dict[tuple[str, str], list[LabelDay]] = {}
    for usage_key, date_key in dict.fromkeys(label_days):
        by_scope_day.setdefault((keys.split_usage_key(usage_key)[0], date_key), []).append((usage_key, date_key))
    return [
        ScopeDay(scope, date_key, days, configs.get(scope)) for (scope, date_key), days in sorted(by_scope_day.items())
    ]


def audit_label_days(label_days: Iterable[LabelDay], now: datetime) -> RunReport:
    """The audit of these label-days: each scope-day of its scope's today has its alerts evaluated
    against its totals as they stand (a past day's are not raised against today's quotas)."""
    label_days = list(label_days)
    every = scope_days_of(label_days, configs_of({keys.split_usage_key(usage_key)[0] for usage_key, _ in label_days}))
    scope_days = [scope_day for scope_day in every if scope_day.is_today(now)]
    report = RunReport(days=sorted({keys.day_of_key(scope_day.date_key) for scope_day in every}))
    # nothing is folded: the alerts' labels, the scope totals and the sticky labels, not every listed label's total
    snapshot = read_for_fold([scope_day._replace(label_days=[]) for scope_day in scope_days])
    for scope_day in scope_days:
        stored = snapshot.totals.get((scope_day.total_key["usage_key"], scope_day.date_key), {})
        report_moved(report, scope_day, snapshot, [], int(stored.get("cost_usd_micros", 0)))
    return report
