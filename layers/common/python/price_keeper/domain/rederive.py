"""Totals re-derived from their records, read by key: what the stream lost is recovered.

A record the stream trimmed before the fold read it is counted only in its marker. Once a day, for each settled org
day, the audit reads the org's markers by key (a Query per bucket, never a Scan), sums each label-day as the fold
would (``ledger.counted``), and writes the label totals that differ. It is exact because it runs only once the day's
latest marker change is ``SETTLED_SECS`` old, and each write is conditional on the total it read.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from ..config import get_config
from ..errors import service_unavailable
from ..observability import logger
from ..store import dynamo, keys, usage
from ..store import reconciliation as reconciliation_store
from ..timeutil import day_start_utc, parse_day
from . import aggregation, ledger, orgs
from .aggregation import SUM_FIELDS, LabelDay, Move, RunReport, ScopeDay

SETTLED_SECS = 26 * 3600  # the stream's 24 h, a fold's 15 min timeout, and a margin
CHANGE_TIMES = ("accepted_at_epoch", "voided_at_epoch", "repriced_at_epoch")
WRITE_ATTEMPTS = 3


def due(timezone: str, day: str, now: datetime, every_secs: int = 3600) -> bool:
    """Whether the audit at ``now`` is the first past the day's end + grace + ``SETTLED_SECS``."""
    end = day_start_utc(timezone, parse_day(day) + timedelta(days=1))
    ready = end + timedelta(seconds=get_config().metering.backdate_grace_secs + SETTLED_SECS)
    return ready <= now < ready + timedelta(seconds=every_secs)


def rederive(org_id: str, day: str, now: datetime) -> RunReport:
    """Re-derive the org's label totals of org day ``day`` from its markers; what was written."""
    config = orgs.effective_config(org_id)
    markers = [m for m in usage.org_markers(org_id, config.agg_shard_count) if m.get("org_day") == day]
    report = RunReport(days=[day])
    latest = max((int(m[name]) for m in markers for name in CHANGE_TIMES if name in m), default=0)
    if latest > now.timestamp() - SETTLED_SECS:
        logger.warning("re-derivation deferred: a record of the day changed lately", extra={"org": org_id, "day": day})
        return report
    derived = _changes(markers)
    for attempt in range(WRITE_ATTEMPTS):
        if attempt:
            dynamo._backoff(attempt)
        if (written := _write(derived, now)) is not None:
            report.merge(written)
            return report
    raise service_unavailable()


Changes = list[tuple[int, dict[str, int]]]  # a label-day's (epoch, delta) from its markers


def _changes(markers: list[dict]) -> dict[LabelDay, Changes]:
    """Each label-day's changes, as the fold adds a marker's insert and then its void or re-pricing."""
    derived: dict[LabelDay, Changes] = {}
    for marker in markers:
        inserted = {
            name: value for name, value in marker.items() if name not in ("voided_at_epoch", "repriced_at_epoch")
        }
        first, now = ledger.counted(inserted), ledger.counted(marker)
        later = max((int(marker[name]) for name in CHANGE_TIMES[1:] if name in marker), default=None)
        for scope in marker["scopes"]:
            label_day = (keys.usage_key(scope, marker["model_label"]), keys.day_key(marker["org_day"]))
            changes = derived.setdefault(label_day, [])
            changes.append((int(marker["accepted_at_epoch"]), first))
            if later is not None:
                changes.append((later, {name: now[name] - first[name] for name in SUM_FIELDS}))
    return derived


def _summed(changes: Changes) -> tuple[dict[str, int], bytes]:
    """The sums of ``changes`` and their hour marks (the running sums at each hour's last change)."""
    running, marks = dict.fromkeys(SUM_FIELDS, 0), {}
    for epoch, delta in sorted(changes, key=lambda change: change[0]):
        for name, value in delta.items():
            running[name] += value
        marks[epoch // 3600] = [running[name] for name in reconciliation_store.MARK_FIELDS]
    return running, reconciliation_store.pack_marks(marks)


def _write(derived: dict[LabelDay, Changes], now: datetime) -> RunReport | None:
    """Set the label totals that differ from their markers' sums: one transaction a scope-day.
    None when a total moved between its read and the write: read again."""
    configs = aggregation.configs_of({keys.split_usage_key(usage_key)[0] for usage_key, _ in derived})
    scope_days = aggregation.scope_days_of(derived, configs)
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
        day = keys.day_of_key(scope_day.date_key)
        if dynamo.transact(aggregation.scope_day_actions(scope_day, moves, now)) is not None:
            return None
        logger.warning(
            "label totals re-derived from their records",
            extra={"scope": scope_day.scope, "day": day, "labels": [move.label for move in moves]},
        )
        report.totals_written += len(moves)
        report.changed += [(move.fold.usage_key, day) for move in moves]
    return report


def _move(scope_day: ScopeDay, label_day: LabelDay, stored: dict, changes: Changes, now: datetime) -> Move | None:
    """The move of a label total to what its markers sum to; None when it holds that already."""
    sums, marks = _summed(changes)
    if all(int(stored.get(name, 0)) == sums[name] for name in SUM_FIELDS) and "requests" in stored:
        return None
    latest = max(epoch for epoch, _ in changes)
    return aggregation.label_move(scope_day, label_day, stored, sums, latest, now, marks=marks)


def candidate_days(now: datetime) -> list[str]:
    """The org days (``yyyymmdd``) that can be due at ``now`` in some timezone: UTC today - 3 .. - 1."""
    return [(now - timedelta(days=back)).strftime("%Y%m%d") for back in (3, 2, 1)]


def due_org_days(listed: Iterable[LabelDay], now: datetime) -> list[tuple[str, str]]:
    """The (org id, yyyymmdd) the audit at ``now`` re-derives: each org day with spend in ``listed`` that is ``due``."""
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
