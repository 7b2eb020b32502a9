"""The ledger: usage counted by its dedup marker alone, folded from the stream's images.

A record is one conditional PutItem of its marker (1 write unit), and a void or a
re-pricing is an update of that marker. The usage table's stream carries each change with
its old and new image, and what a change counts is what its new image counts less what its
old one did (``counted``). The aggregator adds that to the label totals, exactly once:

- A stream shard's progress is one item (``keys.ledger_shard_key``): the sequence number
  of the last record folded from it. A run reads it and skips every record at or before it,
  so a record counts once however its deliveries are cut: a batch delivered again, longer or
  shorter, from any record, or a restart's replay of the whole stream.
- The rest is cut into chunks in record order (``chunks``: as many label-days as one
  transaction holds with their listings and scope totals). A chunk is one
  TransactWriteItems: its label totals SET to what they held plus the chunk's changes (each
  conditional on the progress read, as every fold's write is), its scope totals' ADDs and
  listings, and the shard's progress moved to its last record, conditional on the progress
  the run read.
- A run stops at the first chunk it could not write and names that chunk's first record to
  the event source mapping (``ReportBatchItemFailures``), which delivers the batch again
  from there. The mapping never gives a batch up (no retry or age limit): every record is
  folded while the stream holds it (24 h).

Sequence numbers order the records of one stream shard only, and a Lambda stream event
names its shard only with a tumbling window (``shardId``): the mapping has one
(``USAGE_STREAM.tumbling_window_s``) for that alone. docs/metering.md ("The ledger") has
the argument and what it costs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from ..errors import service_unavailable
from ..observability import logger
from ..store import daily_totals, dynamo, keys, usage
from ..timeutil import utc_now
from . import aggregation, orgs
from .aggregation import SUM_FIELDS, LabelDay, RunReport

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

CHUNK_ACTIONS = 100  # TransactWriteItems' limit: a chunk's writes and the shard's progress
PROGRESS_DAYS = 2  # a shard's progress outlives the shard (about 4 h of writes, read for 24 h)
# Reads of a chunk's totals gone stale because another stream shard's fold wrote one first:
# read again at once, without using up an attempt. A hot label's total is written by every
# shard's fold; counted as failures, these stopped its batches after ``FOLD_ATTEMPTS`` and
# the fold fell behind (benchmarks/stream_shards.py). Each one is another fold's progress.
OVERTAKEN_LIMIT = 100


def counted(image: dict | None) -> dict[str, int]:
    """What a marker counts toward its label totals (nothing for none): its cost, tokens
    and one request, or once voided none of them and one void; one correction once
    re-priced."""
    sums = dict.fromkeys(SUM_FIELDS, 0)
    if not image:
        return sums
    sums[usage.CORRECTIONS] = int("repriced_at_epoch" in image)
    if "voided_at_epoch" in image:
        sums[usage.VOIDS] = 1
        return sums
    for name in (*usage.COUNTERS, usage.SETTLED):  # the marker holds them all but ``requests``: one
        sums[name] = int(image.get(name, 0))
    sums["requests"] = 1
    return sums


class Change(NamedTuple):
    """One stream record of a ledger marker: what it adds to each of its label-days."""

    position: int  # in the batch
    sequence: str  # its sequence number, as ``daily_totals.sequence_key``
    label_days: tuple[LabelDay, ...]  # one a scope it was counted in
    delta: dict[str, int]
    created_epoch: int
    live_cost: int  # what a tight record's insert put on its quota scope's live item (``usage.LIVE``)
    live_part: int  # which of the label-day's live items (``keys.live_part``)


def changes(records: Sequence[DynamoDBRecord]) -> list[Change]:
    """The markers' inserts and updates of a stream batch, in order (a TTL's removal takes
    nothing back)."""
    found = []
    for position, record in enumerate(records):
        new = record.dynamodb.new_image if record.dynamodb else None
        marker = (
            str(record.dynamodb.keys.get("date_key", "")).startswith(keys.MARKER_PREFIX) if record.dynamodb else False
        )
        inserted_or_updated = record.event_name is not None and record.event_name.name in ("INSERT", "MODIFY")
        if not (marker and inserted_or_updated and new):
            continue
        before, after = counted(record.dynamodb.old_image), counted(new)
        if before == after:
            continue  # an update that changes nothing counted
        day = keys.day_key(new["org_day"])
        found.append(
            Change(
                position,
                daily_totals.sequence_key(record.dynamodb.sequence_number),
                tuple((keys.usage_key(scope, new["model_label"]), day) for scope in new["scopes"]),
                {name: after[name] - before[name] for name in SUM_FIELDS},
                int(record.dynamodb.approximate_creation_date_time or new["accepted_at_epoch"]),
                int(new["cost_usd_micros"]) if record.event_name.name == "INSERT" and new.get(usage.LIVE) else 0,
                keys.live_part(record.dynamodb.keys),
            )
        )
    return found


def chunks(
    found: list[Change], config_labels: Collection[str], folded_before: Collection[LabelDay] = ()
) -> list[list[Change]]:
    """``found`` cut greedily in order, each chunk's writes within one transaction with the
    shard's progress (``CHUNK_ACTIONS``): per label-day its label total, and on its first fold
    (not among ``folded_before``) its index entry and, for a label the scope total counts (not
    one of ``config_labels``: they are kept apart), its listing item; and once a scope-day of
    such labels, the scope total. So a batch of label-days folded before is one write each, 97
    to a chunk, and a hot label or a hot scope total is in a chunk or two of a shard's batch."""
    cut: list[list[Change]] = []
    label_days: set[LabelDay] = set()
    scope_days: set[tuple[str, str]] = set()
    actions = 0
    for change in found:
        for fresh_chunk in (False, True):
            if fresh_chunk or not cut:
                cut.append([])
                label_days, scope_days, actions = set(), set(), 1
            new = [label_day for label_day in change.label_days if label_day not in label_days]
            counted = [ld for ld in new if keys.split_usage_key(ld[0])[1] not in config_labels]
            first = [ld for ld in new if ld not in folded_before]
            listed = [ld for ld in first if ld in counted]
            new_scope_days = {(keys.split_usage_key(ld[0])[0], ld[1]) for ld in counted} - scope_days
            need = len(new) + len(first) + len(listed) + len(new_scope_days)
            if actions + need <= CHUNK_ACTIONS or not cut[-1]:
                break
        cut[-1].append(change)
        label_days |= set(new)
        scope_days |= new_scope_days
        actions += need
    return cut


class Folded(NamedTuple):
    report: RunReport
    # the sequence number of the first record of the chunk that could not be written: where
    # the mapping delivers the batch again from (``ReportBatchItemFailures``)
    resume_at: str | None


class Progress:
    """How far a stream shard was folded, as this run last read or wrote it."""

    def __init__(self, shard_id: str):
        self.shard_id = shard_id
        self.folded_to = daily_totals.folded_to(shard_id)

    def unfolded(self, found: list[Change]) -> list[Change]:
        return [change for change in found if self.folded_to is None or change.sequence > self.folded_to]


def fold_batch(records: Sequence[DynamoDBRecord], shard_id: str, now: datetime | None = None) -> Folded:
    """Fold a stream shard's batch of marker changes past the shard's progress, chunk by
    chunk, stopping at the first that fails."""
    now = now or utc_now()
    records = list(records)  # the handler's are a generator: read by ``changes``, then indexed at a failure
    found = changes(records)
    if not found:  # (no marker changes: no progress to read)
        return Folded(RunReport(days=[]), None)
    progress = Progress(shard_id)
    unfolded = progress.unfolded(found)
    report = RunReport(days=sorted({keys.day_of_key(d) for change in unfolded for _, d in change.label_days}))
    if not unfolded:
        return Folded(report, None)
    configs = aggregation.configs_of(scopes_of(unfolded))
    orgs.record_config_labels()  # stored before any spend is kept apart from a scope total under one of them
    # the batch's totals read once (each chunk's first attempt writes on what it read), so the
    # chunks can be cut by what they will write
    read = aggregation.read_for_fold(_scope_days(unfolded, configs))
    folded_before = {label_day for label_day, item in read.totals.items() if "requests" in item}
    for chunk in chunks(unfolded, orgs.config_labels_ever(), folded_before):
        try:
            report.merge(_fold_chunk(chunk, configs, now, progress, read))
        except Exception:  # noqa: BLE001 - named to the mapping, which delivers the batch again from it
            logger.exception("ledger fold failed", extra={"sequence": chunk[0].sequence, "shard": shard_id})
            return Folded(report, records[chunk[0].position].dynamodb.sequence_number)
    aggregation.stream_heartbeat(report.lag_seconds, now)
    return Folded(report, None)


def _fold_chunk(
    chunk: list[Change], configs: dict, now: datetime, progress: Progress, batch_read: aggregation.Snapshot
) -> RunReport:
    """Write one chunk (its label-days' actions and the shard's progress) until it lands, leaving
    out what the shard's progress shows folded meanwhile (another run of the same records): on
    the batch's ``batch_read`` first (which it updates with what it wrote), then on reads of its own."""
    report = RunReport(days=[])
    pending = chunk
    attempt, overtaken, fresh = 0, 0, False
    while pending:
        scope_days, snapshot, moves = _moves(pending, configs, now, None if fresh else batch_read)
        actions = [action for scope_day in scope_days for action in _scope_day_actions(scope_day, moves, now)]
        expires_at = int(now.timestamp()) + PROGRESS_DAYS * 86400
        read = progress.folded_to
        written = daily_totals.write_folded(actions, progress.shard_id, read, pending[-1].sequence, expires_at)
        progress.folded_to = written.folded_to
        if written.done:
            _take_back_live(pending)
            for scope_day in scope_days:
                report.merge(_moved(scope_day, snapshot, moves, pending, now))
            _written(batch_read, scope_days, moves)
            return report
        fresh = True
        if written.folded_to != read:  # another run folded some of them: no failed attempt
            pending = progress.unfolded(pending)
            continue
        if written.overtaken and overtaken < OVERTAKEN_LIMIT:
            overtaken += 1
            dynamo._backoff(0)  # (10-20 ms: the fold that wrote first is done)
            continue
        attempt += 1
        if attempt == aggregation.FOLD_ATTEMPTS:
            raise service_unavailable()
        dynamo._backoff(attempt)
    return report


def _scope_days(pending: list[Change], configs: dict) -> list[aggregation.ScopeDay]:
    """The scope-days of ``pending``'s label-days."""
    by_scope_day: dict[tuple[str, str], list[LabelDay]] = {}
    for label_day in dict.fromkeys(label_day for change in pending for label_day in change.label_days):
        by_scope_day.setdefault((keys.split_usage_key(label_day[0])[0], label_day[1]), []).append(label_day)
    return [
        aggregation.ScopeDay(scope, date_key, label_days, configs.get(scope))
        for (scope, date_key), label_days in sorted(by_scope_day.items())
    ]


def _written(read: aggregation.Snapshot, scope_days: list[aggregation.ScopeDay], moves: dict) -> None:
    """The batch's ``read`` of totals with what a chunk wrote: its label totals' new values and
    its scope totals' differences (the next chunks write on them)."""
    for scope_day in scope_days:
        total = (scope_day.total_key["usage_key"], scope_day.date_key)
        for move in moves[(scope_day.scope, scope_day.date_key)]:
            read.totals[(move.fold.usage_key, move.fold.date_key)] = dict(move.fold.values)
            if scope_day.in_scope_total(move.label):
                stored = read.totals.setdefault(total, {})
                for name, value in move.difference.items():
                    stored[name] = int(stored.get(name, 0)) + value


def _moves(
    pending: list[Change], configs: dict, now: datetime, read: aggregation.Snapshot | None
) -> tuple[list[aggregation.ScopeDay], aggregation.Snapshot, dict[tuple[str, str], list[aggregation.Move]]]:
    """The scope-days of ``pending``, what was read of them (``read``, else a strongly
    consistent read now), and each one's label moves: the stored totals plus the changes."""
    deltas: dict[LabelDay, dict[str, int]] = {}
    created: dict[LabelDay, int] = {}
    for change in pending:
        for label_day in change.label_days:
            sums = deltas.setdefault(label_day, dict.fromkeys(SUM_FIELDS, 0))
            for name, value in change.delta.items():
                sums[name] += value
            created[label_day] = max(created.get(label_day, 0), change.created_epoch)
    scope_days = _scope_days(pending, configs)
    snapshot = read if read is not None else aggregation.read_for_fold(scope_days, fresh_totals=True)
    moves = {
        (scope_day.scope, scope_day.date_key): [
            aggregation.label_move(
                scope_day,
                label_day,
                stored := snapshot.totals.get(label_day) or {},
                {name: int(stored.get(name, 0)) + deltas[label_day][name] for name in SUM_FIELDS},
                created[label_day],
                now,
            )
            for label_day in scope_day.label_days
        ]
        for scope_day in scope_days
    }
    return scope_days, snapshot, moves


def _scope_day_actions(scope_day: aggregation.ScopeDay, moves: dict, now: datetime) -> list[dict]:
    """One scope-day's writes: its label totals (those the scope total leaves apart alone,
    the others with the scope total's ADD and their listings), and the index entry of each
    label-day folded for the first time (``usage.day_listed``)."""
    folded = moves[(scope_day.scope, scope_day.date_key)]
    alone = [daily_totals.label_total_action(m.fold) for m in folded if not scope_day.in_scope_total(m.label)]
    together = [m for m in folded if scope_day.in_scope_total(m.label)]
    actions = [*alone]
    if together:
        actions += aggregation.scope_fold_actions(scope_day, together, now)
    day = keys.day_of_key(scope_day.date_key)
    actions += [
        usage.day_listed(scope_day.scope, m.label, day, int(now.timestamp()), aggregation.usage_expires_at(day))
        for m in folded
        if m.fold.read_progress is None
    ]
    return actions


def _take_back_live(folded: list[Change]) -> None:
    """Take what ``folded``'s tight records put on their live items back off them, now that
    their totals hold them (``usage.add_live``, after the chunk's transaction, never in it:
    a live item of a hot label takes a write a record). A failure leaves a live item holding
    a record's cost too many, never too few: logged, the fold goes on."""
    live: dict[usage.LiveItem, int] = {}
    for change in folded:
        if change.live_cost:
            usage_key, date_key = change.label_days[0]
            where = (usage_key, keys.day_of_key(date_key), change.live_part)
            live[where] = live.get(where, 0) - change.live_cost
    if not live:
        return
    try:
        usage.add_live(live, aggregation.usage_expires_at(max(day for _, day, _ in live)))
    except Exception:  # noqa: BLE001 - over-counts tight mode's live spend until the day ends; never under
        logger.exception("live spend not taken back", extra={"live_items": len(live)})


def _moved(scope_day: aggregation.ScopeDay, snapshot, moves: dict, pending: list[Change], now: datetime) -> RunReport:
    """What a written chunk moved of ``scope_day``, for its alerts and metrics."""
    folded = moves[(scope_day.scope, scope_day.date_key)]
    stored = snapshot.totals.get((scope_day.total_key["usage_key"], scope_day.date_key), {})
    scope_cost = int(stored.get("cost_usd_micros", 0)) + sum(
        move.difference["cost_usd_micros"] for move in folded if scope_day.in_scope_total(move.label)
    )
    moved = RunReport(
        days=[keys.day_of_key(scope_day.date_key)],
        totals_written=len(folded),
        lag_seconds=int(now.timestamp()) - min(change.created_epoch for change in pending),
    )
    aggregation.report_moved(moved, scope_day, snapshot, folded, scope_cost)
    return moved


def scopes_of(found: Iterable[Change]) -> set[str]:
    return {keys.split_usage_key(usage_key)[0] for change in found for usage_key, _ in change.label_days}
