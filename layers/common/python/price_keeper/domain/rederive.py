"""Totals re-derived from their records, read by key: what the stream lost is recovered.

A record the stream trimmed before the fold read it (a shard's fold stuck for 24 h) is
counted nowhere but in its marker. Once a day, for each org day old enough, the audit
(``repair``) reads the org's markers by key (``usage.org_markers``: a Query of each of its
``agg_shard_count`` buckets, never a Scan), sums each label-day of that day from them
exactly as the fold would (``ledger.counted``), and writes the label totals that differ,
with their scope totals' differences, listings and hour marks.

Why it is exact: it runs only when no stream record about the day's markers can still be
folded. Every change to a marker (its insert, a void, a re-pricing) leaves its time on the
marker; the stream keeps a record 24 h and a fold holds what it read for at most the
function's timeout, so once the day's latest change is ``SETTLED_SECS`` old, each change
is in its total or lost for good. Each total's write is conditional on the total read
beside the markers, so a fold that wrote meanwhile makes the write fail (read again).
A day whose latest change is more recent is left for the next day's audit and logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from ..config import get_config
from ..errors import service_unavailable
from ..observability import logger
from ..store import daily_totals, dynamo, keys, tables, usage
from ..store import reconciliation as reconciliation_store
from ..timeutil import day_start_utc, parse_day
from . import aggregation, ledger, orgs
from .aggregation import SUM_FIELDS, LabelDay, Move, RunReport, ScopeDay

# The stream keeps a record 24 h; a fold holds a read record at most the function's timeout
# (15 min); and a margin.
SETTLED_SECS = 26 * 3600
CHANGE_TIMES = ("accepted_at_epoch", "voided_at_epoch", "repriced_at_epoch")
WRITE_ATTEMPTS = 3


def due(timezone: str, day: str, now: datetime, every_secs: int = 3600) -> bool:
    """Whether org day ``day`` is re-derived by the audit that runs at ``now`` (the audits
    run every ``every_secs``): the first one past the day's end + its grace + ``SETTLED_SECS``."""
    end = day_start_utc(timezone, parse_day(day) + timedelta(days=1))
    ready = end + timedelta(seconds=get_config().metering.backdate_grace_secs + SETTLED_SECS)
    return ready <= now < ready + timedelta(seconds=every_secs)


def rederive(org_id: str, day: str, now: datetime) -> RunReport:
    """Re-derive org ``org_id``'s label totals of org day ``day`` (``yyyymmdd``) from its
    markers; what was written (nothing when the totals were right, or the day not settled)."""
    config = orgs.effective_config(org_id)
    markers = [m for m in usage.org_markers(org_id, config.agg_shard_count) if m.get("org_day") == day]
    report = RunReport(days=[day])
    latest = max((int(m[name]) for m in markers for name in CHANGE_TIMES if name in m), default=0)
    if latest > now.timestamp() - SETTLED_SECS:
        logger.warning("re-derivation deferred: a record of the day changed lately", extra={"org": org_id, "day": day})
        return report
    derived = _sums(markers)
    for attempt in range(WRITE_ATTEMPTS):
        if attempt:
            dynamo._backoff(attempt)
        try:
            report.merge(_write(derived, now))
            return report
        except _Raced:
            continue
    raise service_unavailable()


class _Derived:
    """A label-day's sums from its markers, and its hour marks (sums as of each UTC hour a
    change of it was made in)."""

    def __init__(self):
        self.sums = dict.fromkeys(SUM_FIELDS, 0)
        self.changes: list[tuple[int, dict[str, int]]] = []  # (epoch, delta)

    def add(self, epoch: int, delta: dict[str, int]) -> None:
        for name, value in delta.items():
            self.sums[name] += value
        self.changes.append((epoch, delta))

    def marks(self) -> bytes:
        running, marks = dict.fromkeys(SUM_FIELDS, 0), {}
        for epoch, delta in sorted(self.changes, key=lambda change: change[0]):
            for name, value in delta.items():
                running[name] += value
            marks[epoch // 3600] = [running[name] for name in reconciliation_store.MARK_FIELDS]
        return reconciliation_store.pack_marks(marks)


def _sums(markers: list[dict]) -> dict[LabelDay, _Derived]:
    """Each label-day's sums, as the fold adds a marker's insert and then its void or
    re-pricing (``ledger.counted`` of its image as inserted, then as it is now)."""
    derived: dict[LabelDay, _Derived] = {}
    for marker in markers:
        inserted = {
            name: value for name, value in marker.items() if name not in ("voided_at_epoch", "repriced_at_epoch")
        }
        first, now = ledger.counted(inserted), ledger.counted(marker)
        later = max((int(marker[name]) for name in CHANGE_TIMES[1:] if name in marker), default=None)
        for scope in marker["scopes"]:
            label_day = (keys.usage_key(scope, marker["model_label"]), keys.day_key(marker["org_day"]))
            entry = derived.setdefault(label_day, _Derived())
            entry.add(int(marker["accepted_at_epoch"]), first)
            if later is not None:
                entry.add(later, {name: now[name] - first[name] for name in SUM_FIELDS})
    return derived


class _Raced(Exception):
    """A total moved between its read and the write: read again."""


def _write(derived: dict[LabelDay, _Derived], now: datetime) -> RunReport:
    """The label totals that differ from what their markers sum to, set (each conditional on
    the total read), with their scope totals' differences and listings: one transaction a
    scope-day (and per 100 actions)."""
    by_scope_day: dict[tuple[str, str], list[LabelDay]] = {}
    for usage_key, date_key in derived:
        by_scope_day.setdefault((keys.split_usage_key(usage_key)[0], date_key), []).append((usage_key, date_key))
    configs = aggregation.configs_of({scope for scope, _ in by_scope_day})
    scope_days = [ScopeDay(scope, d, label_days, configs.get(scope)) for (scope, d), label_days in by_scope_day.items()]
    snapshot = aggregation.read_for_fold(scope_days, fresh_totals=True)
    report = RunReport(days=[])
    for scope_day in scope_days:
        moves = [
            _move(scope_day, label_day, snapshot.totals.get(label_day) or {}, derived[label_day], now)
            for label_day in scope_day.label_days
        ]
        moves = [move for move in moves if move is not None]
        if not moves:
            continue
        actions = aggregation.scope_fold_actions(scope_day, moves, now)
        day = keys.day_of_key(scope_day.date_key)
        actions += [
            usage.day_listed(scope_day.scope, move.label, day, int(now.timestamp()), aggregation.usage_expires_at(day))
            for move in moves
            if move.fold.read_progress is None
        ]
        if dynamo.transact(actions) is not None:
            raise _Raced()
        logger.warning(
            "label totals re-derived from their records",
            extra={"scope": scope_day.scope, "day": day, "labels": [move.label for move in moves]},
        )
        report.totals_written += len(moves)
        report.changed += [(move.fold.usage_key, day) for move in moves]
    return report


def _move(scope_day: ScopeDay, label_day: LabelDay, stored: dict, derived: _Derived, now: datetime) -> Move | None:
    """The move of a label total to what its markers sum to; None when it holds that already."""
    if all(int(stored.get(name, 0)) == derived.sums[name] for name in SUM_FIELDS) and "requests" in stored:
        return None
    values = {
        **derived.sums,
        "updated_at_epoch": int(now.timestamp()),
        "source_updated_at_epoch": max(epoch for epoch, _ in derived.changes),
        tables.TTL_ATTRIBUTE: aggregation.usage_expires_at(keys.day_of_key(label_day[1])),
        keys.HOUR_MARKS: derived.marks(),
    }
    first = "requests" not in stored
    fold = daily_totals.LabelFold(*label_day, values, None if first else daily_totals.progress_fields(stored))
    difference = {name: derived.sums[name] - int(stored.get(name, 0)) for name in SUM_FIELDS}
    return Move(fold, difference, first and scope_day.in_scope_total(keys.split_usage_key(label_day[0])[1]))


def candidate_days(now: datetime) -> list[str]:
    """The org days (``yyyymmdd``) that can be due at ``now`` in some timezone: those ending
    26 to 27 hours ago, UTC today - 3 .. - 1."""
    return [(now - timedelta(days=back)).strftime("%Y%m%d") for back in (3, 2, 1)]


def due_org_days(listed: Iterable[LabelDay], now: datetime) -> list[tuple[str, str]]:
    """The (org id, yyyymmdd) the audit at ``now`` re-derives: each org day with spend among
    ``listed`` (label-days of the ``active-by-day`` index) that ``due`` says is settled now."""
    candidates = set(candidate_days(now))
    org_days = {
        (keys.split_scope(keys.split_usage_key(usage_key)[0])[0], keys.day_of_key(date_key))
        for usage_key, date_key in listed
        if keys.day_of_key(date_key) in candidates
    }
    configs = orgs.effective_configs({(org_id, None) for org_id, _ in org_days})
    return sorted(
        (org_id, day)
        for org_id, day in org_days
        if (org_id, None) in configs and due(configs[(org_id, None)].timezone, day, now)
    )
