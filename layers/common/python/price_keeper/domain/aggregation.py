"""DailyTotal: the aggregator that folds usage shards into it, and reading it back.

Two triggers, one fold:

- **The usage table's DynamoDB Stream** (``fold_stream``; Lambda's event source mapping,
  batches within ``USAGE_STREAM.batching_window_s``). A batch names the shards its usage
  writes changed; the run sums every shard of just those labels (``0..first_shard_count-1``
  and those their count items add, ``hot_labels``; strongly consistent) and folds them.
  Totals move a second or two after a write, and a run's work is proportional to the
  labels it changed, not to the shards active that day.
- **The sweep** (``run``; EventBridge every 10 minutes). It repairs whatever the stream
  missed (a batch dropped after its retries, usage written before the stream existed):
  a Query of each partition key of the sparse GSI ``active-by-day`` per org day in play
  (UTC today-2 .. today+1) finds the shards written that day, and all are folded. When the stream kept up
  it writes nothing but its heartbeat.

Folding (``_fold``), exactly once whatever runs overlap, repeat or arrive out of order:

1. One read (BatchGetItem, 100 keys a call) of everything: the changed labels' shards,
   their totals, their scopes' ``{scope}#TOTAL``, the ordering's totals and the sticky
   label (what alerts evaluate). Configs come from the cache, the missing ones in one read.
2. Per scope and day, one transaction (several for a hundred labels or more): each label
   total whose shard sums grew is SET, conditional on its stored progress
   (``daily_totals.PROGRESS``: ``requests``, and ``repriced`` for a re-priced record's
   correction, which changes the cost alone) being what step 1 read, and the scope total is
   ADDed the differences. So the scope total is always the sum of its label totals, a move
   is added once, and a stale or repeated run (Lambda delivers a stream batch at least
   once) writes nothing. A label-day's first fold also lists the label for the scope-day:
   a config label in the scope total's ``labels`` set (bounded by config.yaml), any other
   (a profile) in an item of its own (``keys.spent_label_key``), counted on the scope
   total. Scope-days are written in parallel; one that lost a race re-reads and folds again.
3. A heartbeat (time of the run, lag) that the aggregates endpoint reports as
   ``X-Data-Lag-Secs``: every sweep, and a stream run at most every ``HEARTBEAT_SECONDS``
   per container.

A run that fails half-way leaves totals that are each either old or new, never mixed; the
retried batch (or the next sweep) recomputes every sum from the shards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import TYPE_CHECKING, NamedTuple

from ..cache import TTLCache
from ..config import get_config
from ..errors import service_unavailable
from ..observability import logger
from ..store import daily_totals, dynamo, keys, sticky, tables, usage
from ..store import reconciliation as reconciliation_store
from ..store.dynamo import batch_get_many
from ..timeutil import org_day, org_days_in_play, parse_day, utc_now
from . import hot_labels, orgs
from .orgs import EffectiveConfig

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

# what re-pricing, voids and settlements add, folded too
SUM_FIELDS = (*usage.COUNTERS, usage.CORRECTIONS, usage.VOIDS, usage.SETTLED)
HEARTBEAT_SECONDS = 10
_recent_heartbeat = TTLCache(HEARTBEAT_SECONDS)  # a stream run of this container wrote one lately


class StreamTrigger(NamedTuple):
    """How the usage table's stream invokes the aggregator (the CDK event source mapping
    and the local server's poller both follow it). A failed batch is delivered again, from
    the first record its reply names, until it is folded: no retry or record age limit, no
    bisecting, one batch at a time per stream shard (``domain.ledger``)."""

    batch_size: int
    batching_window_s: int
    # the window carries no state: it is there because only a windowed event names its
    # stream shard (``shardId``), which the ledger's progress is kept by
    tumbling_window_s: int


USAGE_STREAM = StreamTrigger(batch_size=1000, batching_window_s=1, tumbling_window_s=900)


# Records worth a run: shard writes (not the dedup markers, not the TTL's deletions), and on
# ledger days the markers' inserts and updates (``domain.ledger``): one filter each.
SHARD_WRITES = ("INSERT", "MODIFY")
USAGE_STREAM_FILTERS = (
    {"eventName": list(SHARD_WRITES), "dynamodb": {"Keys": {"date_key": {"S": [{"prefix": keys.day_key("")}]}}}},
    {
        "eventName": list(SHARD_WRITES),
        "dynamodb": {"Keys": {"date_key": {"S": [keys.DEDUP_SORT_KEY]}}, "NewImage": {usage.LEDGER: {"N": ["1"]}}},
    },
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
    # The reservation ledger of these totals (``store.reservations``, an item of its own):
    # settled reserved spend plus live holds, the settled part, and of it what was settled
    # by records whose shards carry it (``usage.SETTLED``).
    committed: int = 0
    settled: int = 0
    settled_on_shards: int = 0

    @classmethod
    def from_item(cls, item: dict | None) -> Totals:
        if not item:
            return cls()
        updated = item.get("updated_at_epoch")
        return cls(
            *(int(item.get(name, 0)) for name in SUM_FIELDS),
            updated_at_epoch=int(updated) if updated is not None else None,
        ).with_ledger(item)  # (a total's own item held its ledger before ledgers had items of their own)

    def with_ledger(self, item: dict) -> Totals:
        """These totals with a ledger item's counters added (to what the total's own item
        held, on days reserved on before ledgers had items of their own)."""
        return self._replace(**{name: getattr(self, name) + int(item.get(name, 0)) for name in daily_totals.LEDGER})

    @property
    def reserved(self) -> int:
        """Micro-USD held by live reservations (expired ones until a sweep ends them)."""
        return max(0, self.committed - self.settled)

    @property
    def unreserved(self) -> int:
        """Spend counted without a reservation, as far as the aggregation has folded it: the
        folded cost less the settled spend it holds. A settlement is in the ledger at once
        but in the folded cost only after its fold, so what is taken off is the settled spend
        the fold has counted (``settled_usd_micros``), plus what was settled before records
        carried it (``settled`` - ``settled_on_shards``, folded long since)."""
        folded_settled = self.settled_usd_micros + self.settled - self.settled_on_shards
        return max(0, self.cost_usd_micros - folded_settled)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in SUM_FIELDS}

    def plus(self, others: Iterable[Totals]) -> Totals:
        """These totals with the sums of ``others`` added (the ledger stays this one's)."""
        others = list(others)
        updated = [t.updated_at_epoch for t in [self, *others] if t.updated_at_epoch is not None]
        return self._replace(
            **{name: getattr(self, name) + sum(getattr(t, name) for t in others) for name in SUM_FIELDS},
            updated_at_epoch=max(updated) if updated else None,
        )


def scope_usage_keys(config: EffectiveConfig, scope: str, day: str) -> list[str]:
    """The DailyTotal keys whose sum is ``scope``'s spend on org day ``day`` (yyyymmdd): its
    scope total and, where the org keeps config labels apart from it
    (``EffectiveConfig.labels_apart``), each config.yaml label's total (a few: bounded by
    config.yaml, never by the profiles an app registers)."""
    return [keys.scope_total_key(scope), *(keys.usage_key(scope, label) for label in config.apart_labels(day))]


def scope_totals(config: EffectiveConfig, scope: str, day: str, of: Callable[[str], Totals]) -> Totals:
    """``scope``'s totals over every label on ``day``, from the totals ``of`` each
    ``scope_usage_keys`` key gives; the reservation ledger is its scope total's."""
    total_key, *apart = scope_usage_keys(config, scope, day)
    return of(total_key).plus(of(key) for key in apart)


class DailyRead(NamedTuple):
    totals: dict[str, Totals]  # by usage_key; absent keys have no spend
    last_run_epoch: int | None  # when the aggregator last ran (only when asked for)
    items: dict[str, dict] = {}  # by usage_key: the items read

    def of(self, usage_key: str) -> Totals:
        return self.totals.get(usage_key, Totals())

    def listed_in_set(self, scope: str) -> set[str]:
        """The labels the scope total lists in its ``labels`` set: its config labels (on
        days folded before the spent-label items, every label)."""
        return set(self.items.get(keys.scope_total_key(scope), {}).get(daily_totals.LABELS, ()))

    def listed_apart(self, scope: str, labels: Iterable[str]) -> bool:
        """Whether the scope's spent-label items (``keys.spent_label_key``) name a label
        other than ``labels`` that day (``daily_totals.lists_apart_beyond``)."""
        item = self.items.get(keys.scope_total_key(scope))
        held = {label: self.items[key] for label in labels if (key := keys.usage_key(scope, label)) in self.items}
        return item is not None and daily_totals.lists_apart_beyond(item, held, orgs.config_labels_ever())

    @property
    def reserving(self) -> bool:
        """Whether a scope read has reservation ledgers that day: flagged
        (``daily_totals.RESERVING``), or with ledger counters on a total's own item (the day
        of the deploy that moved them: a hold of before, ended since, has moved its ledger items)."""
        return any(
            daily_totals.RESERVING in item or any(name in item for name in daily_totals.LEDGER)
            for item in self.items.values()
        )

    @classmethod
    def from_items(cls, items: Iterable[dict]) -> DailyRead:
        """From DailyTotal items of one org day: totals, ledger items (added to their
        totals' ledgers) and the heartbeat."""
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
                totals[item["usage_key"]] = totals.get(item["usage_key"], Totals()).with_ledger(item)
        return cls(totals, last_run, read)

    def with_ledgers(self, usage_keys: Iterable[str], day: str) -> DailyRead:
        """This read with the ledgers of ``usage_keys`` added when a scope read is reserving
        that day (one more BatchGetItem, then); as it is otherwise."""
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
    """DailyTotals of one org day in one BatchGetItem (more when over 100 keys); with
    ``ledgers``, their reservation ledgers in the same call."""
    read = daily_totals.day_read(usage_keys, day, include_heartbeat=include_heartbeat, ledgers=ledgers)
    return DailyRead.from_items(batch_get_many([read], consistent=consistent)[0])


# --- the aggregator ----------------------------------------------------------------


class FoldFailed(Exception):
    """Some scope-days of a run could not be folded (each logged); the rest were."""

    def __init__(self, scope_days: list[tuple[str, str]]):
        super().__init__(f"{len(scope_days)} scope-days not folded, e.g. {scope_days[0]}")
        self.scope_days = scope_days


@dataclass
class RunReport:
    days: list[str]
    active_shards: int = 0
    usage_keys: int = 0
    totals_written: int = 0
    stale_puts_skipped: int = 0
    lag_seconds: int = 0  # age of the oldest shard update this run folded (0: nothing new)
    # (usage_key, yyyymmdd, cost_usd_micros) of the labels alerts need (the ordering's and
    # the ones moved) of every scope/day this run changed, and the labels this run changed
    costs: list[tuple[str, str, int]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    # (scope, yyyymmdd) whose alerts the run evaluates: those it moved; the audit, every one it
    # read (level-triggered alerts that two concurrent folds of a scope both missed fire then)
    evaluated: list[tuple[str, str]] = field(default_factory=list)
    # (scope, yyyymmdd) -> the scope's cost over every label, and its sticky label (read
    # beside the totals when the scope uses sticky fallback), for the scopes changed
    scope_costs: dict[tuple[str, str], int] = field(default_factory=dict)
    sticky: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)  # labels passed
    # (scope, yyyymmdd) whose fold failed: logged, the others folded; the handler names the
    # stream records or repair messages to deliver again (``first_unfolded``, ``repair``),
    # else fails the run (``raise_if_failed``)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def raise_if_failed(self) -> None:
        if self.failed:
            raise FoldFailed(self.failed)

    def evaluated_spends(self) -> dict[tuple[str, str], dict[str, int]]:
        """(scope, yyyymmdd) -> ``cost_usd_micros`` by label, for every scope/day whose
        alerts this run evaluates (``evaluated``), in the order it folded them."""
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
        self.active_shards += other.active_shards
        self.usage_keys += other.usage_keys
        self.totals_written += other.totals_written
        self.stale_puts_skipped += other.stale_puts_skipped
        self.lag_seconds = max(self.lag_seconds, other.lag_seconds)
        self.costs += other.costs
        self.changed += other.changed
        self.evaluated += other.evaluated
        self.scope_costs.update(other.scope_costs)
        self.sticky.update(other.sticky)
        self.failed += other.failed


@dataclass
class _Group:
    sums: dict = field(default_factory=lambda: dict.fromkeys(SUM_FIELDS, 0))
    shard_updates: list[int] = field(default_factory=list)

    def add(self, item: dict, updated_at: int) -> None:
        for name in SUM_FIELDS:
            self.sums[name] += int(item.get(name, 0))
        self.shard_updates.append(updated_at)


def changed_labels(records: Iterable[DynamoDBRecord]) -> set[tuple[str, str]]:
    """(usage_key, date_key) of every label whose shards a stream batch wrote; the records
    the first of ``USAGE_STREAM_FILTERS`` lets through, whatever else the batch holds."""
    return {label_day for record in records if (label_day := _label_day_written(record))}


def first_unfolded(records: Iterable[DynamoDBRecord], failed: Iterable[tuple[str, str]]) -> str | None:
    """The sequence number of the first record of a stream batch whose scope-day's fold
    failed (``RunReport.failed``): where the mapping resumes (``ReportBatchItemFailures``),
    so the records before it are not delivered again; None when no record names one."""
    unfolded = set(failed)
    for record in records:
        label_day = _label_day_written(record)
        if label_day and scope_day_of(label_day) in unfolded:
            return record.dynamodb.sequence_number
    return None


def scope_day_of(label_day: LabelDay) -> tuple[str, str]:
    """(scope, yyyymmdd) of a (usage_key, date_key): how ``RunReport`` names scope-days."""
    usage_key, date_key = label_day
    return keys.split_usage_key(usage_key)[0], keys.day_of_key(date_key)


def _label_day_written(record: DynamoDBRecord) -> LabelDay | None:
    """The (usage_key, date_key) whose shard ``record`` wrote, if it is such a write."""
    item_keys = record.dynamodb.keys if record.dynamodb else {}
    date_key = item_keys.get("date_key")
    if (
        record.event_name
        and record.event_name.name in SHARD_WRITES
        and isinstance(date_key, str)
        and date_key.startswith(keys.day_key(""))
        and "shard_key" in item_keys
    ):
        return keys.usage_key_of_shard(item_keys["shard_key"]), date_key
    return None


def usage_expires_at(day: str) -> int:
    """TTL of an org day's shards and total: ``usage_retention_days`` after the day."""
    start = datetime.combine(parse_day(day), time(0), tzinfo=UTC)
    return int(start.timestamp()) + (get_config().metering.usage_retention_days + 1) * 86400


FOLD_THREADS = 8  # scope-days whose transactions are written at once
FOLD_ATTEMPTS = 6  # per scope-day, when a concurrent run moved its totals first
MAX_TRANSACTION_ACTIONS = 100  # DynamoDB's limit on one TransactWriteItems

LabelDay = tuple[str, str]  # (usage_key, date_key)


class Snapshot(NamedTuple):
    """What one read of a fold found: shards by label-day, totals by key, sticky labels."""

    shards: dict[LabelDay, list[dict]]
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

    @property
    def apart_labels(self) -> tuple[str, ...]:
        """The labels the scope total leaves out (``EffectiveConfig.apart_labels``)."""
        return self.config.apart_labels(keys.day_of_key(self.date_key)) if self.config else ()

    def in_scope_total(self, label: str) -> bool:
        return label not in self.apart_labels

    def is_today(self, now: datetime) -> bool:
        """The scope's org-local day is this scope-day's (the day its config's quotas are for)."""
        return self.config is not None and org_day(self.config.timezone, now) == keys.day_of_key(self.date_key)

    def alert_label_days(self) -> list[LabelDay]:
        """The label totals alerts evaluate beside the moved ones: the ordering's, and where
        the scope total leaves them apart, every config label's (the scope's spend)."""
        ordering = self.config.model_ordering if self.config else ()
        labels = dict.fromkeys([*ordering, *self.apart_labels])
        return [(keys.usage_key(self.scope, label), self.date_key) for label in labels]


def read_for_fold(
    label_shards: dict[LabelDay, list[dict]], scope_days: list[ScopeDay], consistent: bool, fresh_totals: bool = False
) -> Snapshot:
    """One BatchGetItem (per 100 keys, over three tables) of everything a fold of
    ``scope_days`` needs: the shards, the label and scope totals, the ordering's totals and
    the sticky labels that alerts evaluate.

    Only the shards are read as ``consistent`` says (a stream run must see the writes that
    triggered it). Totals and sticky labels are read eventually consistent, at half the
    units, unless ``fresh_totals``: a stale total only makes the fold's conditional write
    fail, and the retry reads them fresh (alerts may see the ordering a second late)."""
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
    count_keys = [keys.shard_count_key(*keys.split_usage_key(u), d) for u, d in label_shards]
    shards, totals, sticky_items = batch_get_many(
        [
            usage.shards_read([*(key for label_day in label_shards.values() for key in label_day), *count_keys]),
            daily_totals.fold_read({"usage_key": u, "date_key": d} for u, d in total_keys)._replace(
                consistent=fresh_totals
            ),
            sticky.days_read(sticky_days)._replace(consistent=fresh_totals),
        ],
        consistent=consistent,
    )
    shards += _shards_above(label_shards, [item for item in shards if keys.is_shard_count_key(item["date_key"])])
    by_label: dict[LabelDay, list[dict]] = {}
    for shard in shards:
        if not keys.is_shard_count_key(shard["date_key"]):
            by_label.setdefault((keys.usage_key_of_shard(shard["shard_key"]), shard["date_key"]), []).append(shard)
    passed_of = {
        (item["scope_key"], item["date_key"]): frozenset(item.get("passed_labels", ())) for item in sticky_items
    }
    return Snapshot(
        by_label,
        {(item["usage_key"], item["date_key"]): item for item in totals},
        {
            (scope, day): passed_of.get(
                (keys.sticky_key(scope, day)["scope_key"], keys.sticky_key(scope, day)["date_key"]), frozenset()
            )
            for scope, day in sticky_days
        },
    )


def _shards_above(label_shards: dict[LabelDay, list[dict]], count_items: list[dict]) -> list[dict]:
    """The shards of hot label-days (``hot_labels``) above the ones read, which their count
    items say exist: read now (one more BatchGetItem, once per container and raise) and
    added to ``label_shards`` for re-reads."""
    extra = []
    for item in count_items:
        usage_key, count = item["shard_key"], int(item["shard_count"])
        day = item["date_key"].removeprefix(keys.SHARD_COUNT_PREFIX)
        scope, label = keys.split_usage_key(usage_key)
        hot_labels.learned(scope, label, day, count)
        label_day = (usage_key, keys.day_key(day))
        have = {key["shard_key"] for key in label_shards[label_day]}
        more = [key for key in keys.shard_item_keys(scope, label, label_day[1], count) if key["shard_key"] not in have]
        label_shards[label_day] = [*label_shards[label_day], *more]
        extra += more
    return usage.read_shards(extra, [*SUM_FIELDS, "updated_at_epoch"], consistent=True) if extra else []


class Move(NamedTuple):
    """A label total a fold moves, by how much, and how its label is listed for the
    scope-day when this is the label-day's first fold: ``"set"`` (a config label: the scope
    total's ``labels``), ``"item"`` (any other: ``keys.spent_label_key``), else None."""

    fold: daily_totals.LabelFold
    difference: dict[str, int]
    listing: str | None

    @property
    def label(self) -> str:
        return keys.split_usage_key(self.fold.usage_key)[1]


def _transactions(moves: list[Move]) -> list[list[Move]]:
    """``moves`` in groups whose transaction fits one TransactWriteItems: a write per move,
    a put per label listed in an item, and the scope total's."""
    groups: list[list[Move]] = [[]]
    actions = 1
    for move in moves:
        need = 1 + (move.listing == "item")
        if groups[-1] and actions + need > MAX_TRANSACTION_ACTIONS:
            groups.append([])
            actions = 1
        groups[-1].append(move)
        actions += need
    return groups


def _fold_scope_day(
    scope_day: ScopeDay,
    label_shards: dict[LabelDay, list[dict]],
    snapshot: Snapshot,
    evaluate_unmoved: bool,
    now: datetime,
) -> RunReport:
    """Move the label totals of one scope-day whose shard sums grew, and its scope total by
    their differences: one transaction per group of labels that fits one (a scope of a
    hundred labels or more takes several), each all or nothing. A label the scope total
    leaves apart (``ScopeDay.in_scope_total``) moves on its own, one conditional write.
    On a lost race re-read this scope-day and fold what is left. Its alerts are evaluated
    when it moved, or with ``evaluate_unmoved`` (the audit) when it is the scope's today:
    a past day's are not raised late against quotas and boosts that are today's."""
    folded: list[Move] = []
    written = lag = 0
    for attempt in range(FOLD_ATTEMPTS):
        if attempt:
            dynamo._backoff(attempt)  # (the store's jittered backoff)
            snapshot = read_for_fold(
                {ld: label_shards[ld] for ld in scope_day.label_days}, [scope_day], consistent=True, fresh_totals=True
            )
        report, moves = _moves(scope_day, snapshot, now)
        lag = max(lag, report.lag_seconds)
        scope_cost = int(
            snapshot.totals.get((scope_day.total_key["usage_key"], scope_day.date_key), {}).get("cost_usd_micros", 0)
        )
        alone = [move for move in moves if not scope_day.in_scope_total(move.label)]
        together = [move for move in moves if scope_day.in_scope_total(move.label)]
        lost = False
        for move in alone:
            if not daily_totals.set_label_total(move.fold):
                lost = True
                break
            folded.append(move)
            written += 1
        for group in [] if lost else _transactions(together) if together else []:
            delta = {name: sum(move.difference[name] for move in group) for name in SUM_FIELDS}
            if not _fold_group(scope_day, group, now):
                lost = True
                break
            folded += group
            written += len(group) + 1
            scope_cost += delta["cost_usd_micros"]
        if not lost:
            report.lag_seconds, report.totals_written = lag, written
            if folded or (evaluate_unmoved and scope_day.is_today(now)):
                report_moved(report, scope_day, snapshot, folded, scope_cost)
            return report
    raise service_unavailable()  # a stream batch is retried; the next sweep runs anyway


def _fold_group(scope_day: ScopeDay, group: list[Move], now: datetime) -> bool:
    """One transaction of ``group``'s label totals, their differences added to the scope
    total, and the labels folded for the first time listed; False when a race was lost."""
    return daily_totals.fold_scope(*_scope_fold(scope_day, group, now))


def scope_fold_actions(scope_day: ScopeDay, group: list[Move], now: datetime) -> list[dict]:
    """The actions of ``_fold_group``, for a transaction that holds more."""
    return daily_totals.fold_scope_actions(*_scope_fold(scope_day, group, now))


def _scope_fold(scope_day: ScopeDay, group: list[Move], now: datetime) -> tuple:
    """``daily_totals.fold_scope``'s arguments for ``group``."""
    scope_values = {
        "updated_at_epoch": int(now.timestamp()),
        "source_updated_at_epoch": max(move.fold.values["source_updated_at_epoch"] for move in group),
        tables.TTL_ATTRIBUTE: usage_expires_at(keys.day_of_key(scope_day.date_key)),
    }
    listed = {listing: [move.label for move in group if move.listing == listing] for listing in ("set", "item")}
    delta = {name: sum(move.difference[name] for move in group) for name in SUM_FIELDS}
    return (
        scope_day.scope,
        scope_day.date_key,
        [move.fold for move in group],
        delta,
        scope_values,
        listed["set"],
        listed["item"],
    )


def report_moved(
    report: RunReport, scope_day: ScopeDay, snapshot: Snapshot, folded: list[Move], scope_cost: int
) -> None:
    """What alerts evaluate after a scope-day's fold: the labels moved, their costs and the
    ordering's, the scope's cost (``scope_cost``, its scope total's, and the config labels'
    where it leaves them apart), its sticky labels."""
    day = keys.day_of_key(scope_day.date_key)
    costs = {move.fold.usage_key: move.fold.values["cost_usd_micros"] for move in folded}
    for usage_key, date_key in scope_day.alert_label_days():
        costs.setdefault(usage_key, int((snapshot.totals.get((usage_key, date_key)) or {}).get("cost_usd_micros", 0)))
    report.changed = [(move.fold.usage_key, day) for move in folded]
    report.evaluated = [(scope_day.scope, day)]
    report.costs = [(usage_key, day, cost) for usage_key, cost in costs.items()]
    report.scope_costs[(scope_day.scope, day)] = scope_cost + sum(  # their costs are all in ``costs``
        costs[keys.usage_key(scope_day.scope, label)] for label in scope_day.apart_labels
    )
    if (scope_day.scope, day) in snapshot.sticky:
        report.sticky[(scope_day.scope, day)] = snapshot.sticky[(scope_day.scope, day)]


def _moves(scope_day: ScopeDay, snapshot: Snapshot, now: datetime) -> tuple[RunReport, list[Move]]:
    """The label totals of a scope-day whose shards summed further than stored (``progress``),
    with their differences; the report of the stale ones and of the lag."""
    now_epoch = int(now.timestamp())
    report = RunReport(days=[keys.day_of_key(scope_day.date_key)])
    moves = []
    for label_day in scope_day.label_days:
        shards = snapshot.shards.get(label_day)
        if not shards:
            continue
        group = _Group()
        for shard in shards:
            group.add(shard, int(shard.get("updated_at_epoch", 0)))
        stored = snapshot.totals.get(label_day) or {}
        stored_progress = daily_totals.progress(stored) if "requests" in stored else None
        if stored_progress is None and daily_totals.progress(group.sums) == (0, 0):
            continue  # a ledger label-day's index entry alone (``usage.ledger_day_listed``): the ledger folds it
        if stored_progress is not None and daily_totals.progress(group.sums) <= stored_progress:
            report.stale_puts_skipped += daily_totals.progress(group.sums) < stored_progress
            continue
        folded_until = int(stored.get("source_updated_at_epoch", 0))
        unfolded = [update for update in group.shard_updates if update > folded_until] or group.shard_updates
        report.lag_seconds = max(report.lag_seconds, now_epoch - min(unfolded))
        moves.append(label_move(scope_day, label_day, stored, group.sums, max(group.shard_updates), now))
    return report, moves


def label_move(
    scope_day: ScopeDay, label_day: LabelDay, stored: dict, sums: dict, source_updated_at: int, now: datetime
) -> Move:
    """A label total's move from ``stored`` to ``sums`` (what its shards sum to, or for the
    ledger what it holds plus a batch's changes): conditional on ``stored``'s progress, with
    this UTC hour's mark, and listed for the scope-day when it is the label-day's first."""
    day = keys.day_of_key(scope_day.date_key)
    values = {
        **sums,
        "updated_at_epoch": int(now.timestamp()),
        "source_updated_at_epoch": source_updated_at,
        tables.TTL_ATTRIBUTE: usage_expires_at(day),
        # its sums as of this UTC hour, beside those of the hours before (domain.reconciliation)
        keys.HOUR_MARKS: reconciliation_store.with_mark(stored, now, sums),
    }
    first = "requests" not in stored
    fold = daily_totals.LabelFold(*label_day, values, None if first else daily_totals.progress_fields(stored))
    difference = {name: sums[name] - int(stored.get(name, 0)) for name in SUM_FIELDS}
    label = keys.split_usage_key(label_day[0])[1]
    listing = None  # a label the scope total leaves apart is never listed: readers read them all
    if first and scope_day.in_scope_total(label):
        listing = "set" if label in get_config().labels else "item"
    return Move(fold, difference, listing)


def _fold(
    label_shards: dict[LabelDay, list[dict]],
    configs: dict[str, EffectiveConfig],
    report: RunReport,
    now: datetime,
    *,
    audit: bool,
) -> None:
    """Fold every label-day of ``label_shards`` (its shards' keys: all of them on the stream)
    into its total and its scope's: one read for all, one transaction per scope-day, the
    transactions in parallel. Strongly consistent reads when the run must see the writes
    that triggered it (the stream's, a repair of it); the ``audit`` reads eventually
    consistent, and also evaluates the alerts of the scope-days it did not move."""
    by_scope_day: dict[tuple[str, str], list[LabelDay]] = {}
    for usage_key, date_key in label_shards:
        by_scope_day.setdefault((keys.split_usage_key(usage_key)[0], date_key), []).append((usage_key, date_key))
    scope_days = [
        ScopeDay(scope, date_key, label_days, configs.get(scope))
        for (scope, date_key), label_days in sorted(by_scope_day.items())
    ]
    if any(scope_day.apart_labels for scope_day in scope_days):
        orgs.record_config_labels()  # stored before any spend is kept apart under one of them
    snapshot = read_for_fold(label_shards, scope_days, consistent=not audit)
    report.active_shards += sum(len(shards) for shards in snapshot.shards.values())
    report.usage_keys += len(snapshot.shards)
    with ThreadPoolExecutor(max_workers=FOLD_THREADS) as pool:
        futures = [
            (scope_day, pool.submit(_fold_scope_day, scope_day, label_shards, snapshot, audit, now))
            for scope_day in scope_days
        ]
    for scope_day, future in futures:
        try:
            report.merge(future.result())
        except Exception:  # noqa: BLE001 - one scope's failure must not stop the others' totals and alerts
            logger.exception("fold failed", extra={"scope": scope_day.scope, "date_key": scope_day.date_key})
            report.failed.append((scope_day.scope, keys.day_of_key(scope_day.date_key)))


def configs_of(scopes: Iterable[str]) -> tuple[dict[str, EffectiveConfig], dict[str, EffectiveConfig]]:
    """Each scope's effective config and its org's (for the shard count), read together;
    scopes of orgs or apps no longer registered are left out."""
    pairs = {keys.split_scope(scope) for scope in scopes}
    configs = orgs.effective_configs(pairs | {(org_id, None) for org_id, _ in pairs})
    return (
        {scope: configs[keys.split_scope(scope)] for scope in scopes if keys.split_scope(scope) in configs},
        {
            scope: configs[(keys.split_scope(scope)[0], None)]
            for scope in scopes
            if (keys.split_scope(scope)[0], None) in configs
        },
    )


def heartbeat(lag_seconds: int, now: datetime) -> None:
    """What ``X-Data-Lag-Secs`` reports: when the aggregator last ran, and its lag then."""
    daily_totals.put_heartbeat(int(now.timestamp()), lag_seconds)


def days_in_play(now: datetime) -> list[str]:
    """The org days (``yyyymmdd``) that can still receive usage somewhere: UTC today-2 .. today+1."""
    return [day.strftime("%Y%m%d") for day in org_days_in_play(now)]


def active_label_shards(day: str) -> dict[LabelDay, list[dict]]:
    """The shards written on org day ``day`` by label-day, from the sparse index (which lags
    the writes a little: the stream folds the newest)."""
    label_shards: dict[LabelDay, list[dict]] = {}
    for shard in usage.active_shard_keys(day):
        label_shards.setdefault((keys.usage_key_of_shard(shard["shard_key"]), shard["date_key"]), []).append(shard)
    return label_shards


def fold_shards(label_shards: dict[LabelDay, list[dict]], now: datetime | None = None) -> RunReport:
    """The audit's fold: these label-days from the shards the index found (and any above
    them that a raised shard count names), spend of orgs no longer registered included."""
    now = now or utc_now()
    report = RunReport(days=sorted({keys.day_of_key(date_key) for _, date_key in label_shards}))
    if label_shards:
        configs, _ = configs_of({keys.split_usage_key(usage_key)[0] for usage_key, _ in label_shards})
        _fold(label_shards, configs, report, now, audit=True)
    return report


def run(now: datetime | None = None) -> RunReport:
    """The audit in one process (tests and tools; deployed, ``repair.plan_audit`` fans it out
    over the repair queue): fold every shard written on the org days in play."""
    now = now or utc_now()
    days = days_in_play(now)
    report = fold_shards({ld: keys_ for day in days for ld, keys_ in active_label_shards(day).items()}, now)
    report.days = days
    heartbeat(report.lag_seconds, now)
    return report


def fold_stream(records: Iterable[DynamoDBRecord], now: datetime | None = None) -> RunReport:
    """An event-driven run: fold the labels a stream batch changed, all of their shards."""
    return fold_label_days(changed_labels(records), now)


def fold_label_days(changed: set[LabelDay], now: datetime | None = None) -> RunReport:
    """Fold these (usage_key, date_key) label-days, all of their shards, strongly
    consistent: a stream batch's, or a repair's (``domain.repair``)."""
    now = now or utc_now()
    report = RunReport(days=sorted({keys.day_of_key(date_key) for _, date_key in changed}))
    if not changed:
        return report
    configs, org_configs = configs_of({keys.split_usage_key(usage_key)[0] for usage_key, _ in changed})
    label_shards = {}
    for usage_key, date_key in sorted(changed):
        scope, label = keys.split_usage_key(usage_key)
        if scope not in org_configs:
            logger.warning("spend of an unregistered org left to the sweep", extra={"scope": scope})
            continue
        # the org's, or what this container learned of the label-day's since (the fold reads the count item too)
        day = keys.day_of_key(date_key)
        shard_count = hot_labels.shard_count(scope, label, day, org_configs[scope].starting_shards(day))
        label_shards[(usage_key, date_key)] = keys.shard_item_keys(scope, label, date_key, shard_count)
    if not label_shards:
        return report
    _fold(label_shards, configs, report, now, audit=False)
    if not _recent_heartbeat.get("written"):
        heartbeat(report.lag_seconds, now)
        _recent_heartbeat.put("written", True)
    return report
