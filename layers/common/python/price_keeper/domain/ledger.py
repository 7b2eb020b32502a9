"""The ledger: usage counted by its dedup marker alone, folded from the stream's images.

A record is one conditional PutItem of its marker; a void or re-pricing updates it. What a stream change counts is its
new image's count less its old one's (``counted``), added to the label totals exactly once: each stream shard's
progress (the last sequence number folded) is an item, and each chunk of a batch is one transaction that writes its
totals and moves the progress, conditional on the progress read, so redelivered or replayed records are skipped. A run
stops at the first chunk it could not write and names its first record to the event source mapping, which delivers the
batch again from there. See docs/metering.md ("The fold").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from ..errors import service_unavailable
from ..observability import logger
from ..store import daily_totals, dynamo, keys, usage
from ..timeutil import utc_now
from . import aggregation, orgs
from .aggregation import SUM_FIELDS, LabelDay, Move, RunReport, ScopeDay

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

CHUNK_ACTIONS = 100  # TransactWriteItems' limit: a chunk's writes and the shard's progress
PROGRESS_DAYS = 2  # a shard's progress outlives the shard (about 4 h of writes, read for 24 h)
# Reads gone stale because another shard's fold wrote first are retried at once without using
# up an attempt: a hot label's total is written by every shard's fold, and each is progress.
OVERTAKEN_LIMIT = 100


def counted(image: dict | None) -> dict[str, int]:
    """What a marker counts toward its label totals: its cost, tokens and one request (voided:
    one void instead), and one correction once re-priced."""
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
    """The markers' inserts and updates of a stream batch, in order (TTL removals take nothing back)."""
    found = []
    for position, record in enumerate(records):
        stream, event = record.dynamodb, record.event_name
        if stream is None or event is None or event.name not in ("INSERT", "MODIFY") or not (new := stream.new_image):
            continue
        if not keys.is_marker(stream.keys.get("date_key", "")):
            continue
        before, after = counted(stream.old_image), counted(new)
        if before == after:
            continue  # an update that changes nothing counted
        day = keys.day_key(new["org_day"])
        found.append(
            Change(
                position,
                daily_totals.sequence_key(stream.sequence_number),
                tuple((keys.usage_key(scope, new["model_label"]), day) for scope in new["scopes"]),
                {name: after[name] - before[name] for name in SUM_FIELDS},
                int(stream.approximate_creation_date_time or new["accepted_at_epoch"]),
                int(new["cost_usd_micros"]) if event.name == "INSERT" and new.get(usage.LIVE) else 0,
                keys.live_part(stream.keys),
            )
        )
    return found


def chunks(
    found: list[Change], config_labels: Collection[str], folded_before: Collection[LabelDay] = ()
) -> list[list[Change]]:
    """``found`` cut greedily in order so each chunk's writes fit one transaction with the shard's
    progress: per label-day its total, on its first fold its index entry and (labels the scope
    total counts) listing, and once per scope-day the scope total."""
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
    resume_at: str | None  # the first record of the chunk not written (``ReportBatchItemFailures``)


class Progress:
    """How far a stream shard was folded, as this run last read or wrote it."""

    def __init__(self, shard_id: str):
        self.shard_id = shard_id
        self.folded_to = daily_totals.folded_to(shard_id)

    def unfolded(self, found: list[Change]) -> list[Change]:
        return [change for change in found if self.folded_to is None or change.sequence > self.folded_to]


def fold_batch(records: Sequence[DynamoDBRecord], shard_id: str, now: datetime | None = None) -> Folded:
    """Fold a shard's batch past its progress, chunk by chunk, stopping at the first that fails."""
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
    configs = aggregation.configs_of({keys.split_usage_key(usage_key)[0] for usage_key, _ in _label_days(unfolded)})
    orgs.record_config_labels()  # stored before any spend is kept apart from a scope total under one of them
    read = aggregation.read_for_fold(aggregation.scope_days_of(_label_days(unfolded), configs))  # once a batch
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
    """Write one chunk (its label-days' actions and the shard's progress) until it lands, leaving out what another run
    folded meanwhile: on ``batch_read`` first (updated with what it wrote), then on reads of its own."""
    report = RunReport(days=[])
    pending = chunk
    attempt, overtaken, fresh = 0, 0, False
    while pending:
        snapshot, moved = _moves(pending, configs, now, None if fresh else batch_read)
        actions = [
            action for scope_day, moves in moved for action in aggregation.scope_day_actions(scope_day, moves, now)
        ]
        expires_at = int(now.timestamp()) + PROGRESS_DAYS * 86400
        read = progress.folded_to
        written = daily_totals.write_folded(actions, progress.shard_id, read, pending[-1].sequence, expires_at)
        progress.folded_to = written.folded_to
        if written.done:
            _take_back_live(pending)
            for scope_day, moves in moved:
                report.merge(_moved(scope_day, snapshot, moves, pending, now))
            _written(batch_read, moved)
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


def _label_days(pending: list[Change]) -> list[LabelDay]:
    return [label_day for change in pending for label_day in change.label_days]


def _written(read: aggregation.Snapshot, moved: list[tuple[ScopeDay, list[Move]]]) -> None:
    """``read`` updated with what a chunk wrote (label totals, scope total differences)."""
    for scope_day, moves in moved:
        total = (scope_day.total_key["usage_key"], scope_day.date_key)
        for move in moves:
            read.totals[(move.fold.usage_key, move.fold.date_key)] = dict(move.fold.values)
            if scope_day.in_scope_total(move.label):
                stored = read.totals.setdefault(total, {})
                for name, value in move.difference.items():
                    stored[name] = int(stored.get(name, 0)) + value


def _moves(
    pending: list[Change], configs: dict, now: datetime, read: aggregation.Snapshot | None
) -> tuple[aggregation.Snapshot, list[tuple[ScopeDay, list[Move]]]]:
    """The read of ``pending``'s scope-days (``read``, else a consistent one), and each scope-day's label moves."""
    deltas: dict[LabelDay, dict[str, int]] = {}
    created: dict[LabelDay, int] = {}
    for change in pending:
        for label_day in change.label_days:
            sums = deltas.setdefault(label_day, dict.fromkeys(SUM_FIELDS, 0))
            for name, value in change.delta.items():
                sums[name] += value
            created[label_day] = max(created.get(label_day, 0), change.created_epoch)
    scope_days = aggregation.scope_days_of(_label_days(pending), configs)
    snapshot = read if read is not None else aggregation.read_for_fold(scope_days, fresh_totals=True)

    def move(scope_day: ScopeDay, label_day: LabelDay) -> Move:
        stored = snapshot.totals.get(label_day) or {}
        sums = {name: int(stored.get(name, 0)) + deltas[label_day][name] for name in SUM_FIELDS}
        return aggregation.label_move(scope_day, label_day, stored, sums, created[label_day], now)

    return snapshot, [(scope_day, [move(scope_day, ld) for ld in scope_day.label_days]) for scope_day in scope_days]


def _take_back_live(folded: list[Change]) -> None:
    """Take ``folded``'s tight records' costs back off their live items now their totals hold them
    (after the transaction, not in it). A failure is logged: a live item too high, never too low."""
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


def _moved(scope_day: ScopeDay, snapshot, folded: list[Move], pending: list[Change], now: datetime) -> RunReport:
    """What a written chunk moved of ``scope_day``, for its alerts and metrics."""
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
