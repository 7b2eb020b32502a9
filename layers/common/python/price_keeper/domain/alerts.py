"""Spend alerts: detection (pure functions), a once-per-day record, and EventBridge events.

Kinds, per quota scope and org-local day: ``THRESHOLD`` (a label's spend, or with no label
the scope's total, reached a percentage of its quota or cap), ``FALLBACK`` (selection moved
off a label), ``ALL_EXHAUSTED`` (selection answers 429), ``UNPRICED_MODEL`` (usage counted at
the estimate), ``UNREPORTED_USAGE`` (Bedrock counted spend never metered: the reconciler)
and ``OVER_RESERVATION`` (a settlement cost more than its reservation held).

Detection is level-triggered: an alert is due whenever its condition holds, and "once per
day" comes from its record, so a run that crashed after writing totals loses nothing. The
first run to see an alert creates its record (conditional PutItem) and alone publishes the
EventBridge event, then marks it ``published``; a failed publish is retried by a later run
that claims the stale record. A crash between PutEvents and the mark publishes twice, never
zero times.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal

from ..aws import events
from ..cache import TTLCache
from ..observability import logger
from ..store import alert_records, config_items, keys, tables
from ..timeutil import iso_utc, org_day, parse_day
from . import boosts, orgs, reports
from .aggregation import RunReport
from .orgs import EffectiveConfig
from .quota import first_unspent, quota_pct, reached
from .selection import read_sticky

THRESHOLD, FALLBACK, ALL_EXHAUSTED, UNPRICED_MODEL = "THRESHOLD", "FALLBACK", "ALL_EXHAUSTED", "UNPRICED_MODEL"
UNREPORTED_USAGE = "UNREPORTED_USAGE"
OPERATOR_SCOPE = "#OPERATOR"  # alerts of no org (no scope key starts with '#')
OVER_RESERVATION = "OVER_RESERVATION"
ALERT_RETENTION_DAYS = 35
RETRY_AFTER_SECONDS = 30  # an unpublished record claimed longer ago than this is retried
_NO_PART = "-"  # key part of a missing label/threshold (no label can be "-": ids start alphanumeric)

# (scope, date_key) of records known to be published: a warm aggregator skips them without I/O.
_published = TTLCache(24 * 3600)


@dataclass(frozen=True)
class Alert:
    type: str
    label: str | None = None
    threshold_pct: int | None = None
    # context for the event; not part of the alert's identity
    spend_usd_micros: int | None = field(default=None, compare=False)
    quota_usd_micros: int | None = field(default=None, compare=False)
    fallback_to: str | None = field(default=None, compare=False)
    model_id: str | None = None  # UNPRICED_MODEL: one alert per model (part of the identity)
    region: str | None = field(default=None, compare=False)  # UNPRICED_MODEL: the calling region

    def date_key(self, day: str) -> str:
        threshold = _NO_PART if self.threshold_pct is None else str(self.threshold_pct)
        return keys.alert_date_key(day, self.type, self.model_id or self.label or _NO_PART, threshold)


def due_alerts(
    ordering: Sequence[str],
    quotas: Mapping[str, int],
    spends: Mapping[str, int],
    passed: Collection[str],
    thresholds_pct: Sequence[int],
    total_quota: int | None = None,
    total_spend: int | None = None,
) -> list[Alert]:
    """Every alert whose condition holds for these spends (label -> micro-USD; ``total_spend``:
    the scope's spend over every label, when ``spends`` has only some) and the total cap. A label
    is spent by the rules model selection applies (``quota.first_unspent``)."""
    spend = {label: int(spends.get(label, 0)) for label in ordering}
    quota = {label: int(quotas.get(label, 0)) for label in ordering}
    due = [
        Alert(THRESHOLD, label, pct, spend[label], quota[label])
        for label in ordering
        if quota[label] > 0
        for pct in thresholds_pct
        if reached(spend[label], quota[label], pct)
    ]
    active = first_unspent(ordering, quotas, spends, passed)
    active = len(ordering) if active is None else active
    due += [
        Alert(FALLBACK, ordering[i], None, spend[ordering[i]], quota[ordering[i]], ordering[i + 1])
        for i in range(min(active, len(ordering) - 1))
    ]
    total = sum(int(value) for value in spends.values()) if total_spend is None else total_spend
    if total_quota:
        due += [
            Alert(THRESHOLD, None, pct, total, total_quota)
            for pct in thresholds_pct
            if reached(total, total_quota, pct)
        ]
    if (ordering and active == len(ordering)) or (total_quota is not None and total >= total_quota):
        due.append(Alert(ALL_EXHAUSTED))
    return due


def _record(scope: str, config: EffectiveConfig | None, day: str, alert: Alert, now: datetime) -> dict | None:
    """Write the alert's record; the item when this run is the first to see the alert."""
    now_epoch = int(now.timestamp())
    item = {
        "scope_key": scope,
        "date_key": alert.date_key(day),
        "scope": scope,
        "org_id": config.org_id if config else None,
        "app_id": config.app_id if config and config.quota_scope == "APP" else None,
        "date": parse_day(day).isoformat(),
        **asdict(alert),
        "fired_at": iso_utc(now),
        "fired_at_epoch": now_epoch,
        "claimed_at_epoch": now_epoch,
        "attempts": 1,
        "published": False,
        tables.TTL_ATTRIBUTE: now_epoch + ALERT_RETENTION_DAYS * 86400,
    }
    item = {name: value for name, value in item.items() if value is not None}
    return item if alert_records.create(item) else None


def _claim_retry(item: dict, now: datetime) -> dict | None:
    """Take over an unpublished record whose last claim is stale; the item when ours."""
    now_epoch = int(now.timestamp())
    if int(item["claimed_at_epoch"]) > now_epoch - RETRY_AFTER_SECONDS:
        return None
    return alert_records.claim(item, now_epoch)


EVENT_FIELDS = tuple(
    "type label threshold_pct scope org_id app_id date fired_at spend_usd_micros quota_usd_micros fallback_to "
    "model_id region".split()
)
LISTED_FIELDS = ("type", "label", "threshold_pct", "model_id", "scope", "app_id", "fired_at")  # GET .../alerts


def record_fields(item: dict, names: Sequence[str] = EVENT_FIELDS) -> dict:
    """``names`` of an alert record, numbers as ints, absent ones null (by default the event's ``detail``)."""
    values = {name: item.get(name) for name in names}
    return {name: int(value) if isinstance(value, Decimal) else value for name, value in values.items()}


def _publish(item: dict) -> bool:
    """PutEvents for one alert record; False (logged) when EventBridge did not take it."""
    detail = record_fields(item)
    logger.warning("Spend alert", extra={"alert": detail})
    failure = events.put_alert(detail)
    if failure:
        logger.warning("Spend alert not published; the next run retries it", extra={"alert": detail, **failure})
    return failure is None


def evaluate_and_fire(
    config: EffectiveConfig,
    day: str,
    totals_by_label: Mapping[str, int],
    passed: Collection[str],
    now: datetime,
    total_spend: int | None = None,
) -> list[Alert]:
    """Fire the alerts due for ``config``'s scope and an org-local day (``totals_by_label``: the
    day's cost per label; ``passed``: the sticky labels passed); the ones this call published. No
    I/O while every label is under the lowest threshold."""

    def due(quotas: Mapping[str, int]) -> list[Alert]:
        return due_alerts(
            config.model_ordering,
            quotas,
            totals_by_label,
            passed,
            config.alert_thresholds_pct,
            config._replace(quotas=quotas).total_quota,
            total_spend,
        )

    candidates = due(config.quotas)
    if not candidates:
        return []  # boosts only raise quotas: nothing due without them means nothing due with them
    extra = boosts.active_boosts(config, now)
    if extra:
        candidates = due(boosts.apply(config.quotas, extra))
    return _fire(config, day, candidates, now)


def fire_once(config: EffectiveConfig | None, day: str, alert: Alert, now: datetime) -> bool:
    """Record and publish ``alert`` for ``config``'s scope (else ``OPERATOR_SCOPE``) and day, once; whether this
    call published it. A failure is logged, not raised: what fired it (a record counted, a result kept) is done,
    and the next such event tries again."""
    try:
        return bool(_fire(config, day, [alert], now))
    except Exception:  # noqa: BLE001 - only the alert is late
        logger.exception(f"{alert.type} alert failed", extra={"model_id": alert.model_id, "label": alert.label})
        return False


def _fire(config: EffectiveConfig | None, day: str, candidates: Sequence[Alert], now: datetime) -> list[Alert]:
    """Record and publish each alert not yet published for the scope (``config``'s, else
    ``OPERATOR_SCOPE``) and day; the ones published."""
    scope = config.scope if config else OPERATOR_SCOPE
    pending = [alert for alert in candidates if not _published.get((scope, alert.date_key(day)))]
    if not pending:
        return []
    recorded = alert_records.of_day(scope, day)
    fired = []
    for alert in pending:
        key = alert.date_key(day)
        existing = recorded.get(key)
        if existing is not None and existing.get("published"):
            _published.put((scope, key), True)
            continue
        owned = _record(scope, config, day, alert, now) if existing is None else _claim_retry(existing, now)
        if owned is not None and _publish(owned):
            alert_records.mark_published(owned, int(now.timestamp()))
            _published.put((scope, key), True)
            fired.append(alert)
    return fired


def fire_after_run(report: RunReport, now: datetime) -> list[Alert]:
    """Evaluate every scope-day of ``RunReport.evaluated``; one failing scope is logged, not fatal."""
    fired: list[Alert] = []
    changed = report.evaluated_spends()
    orgs.effective_configs({keys.split_scope(scope) for scope, _ in changed})  # the uncached in one read
    for (scope, day), spends in changed.items():
        try:
            config = orgs.effective_config(*keys.split_scope(scope))
            if config.scope != scope:  # an app's own counters in an ORG scope: no quota of their own
                continue
            passed = report.sticky.get((scope, day))  # the run read it beside the totals
            if passed is None:
                sticky = read_sticky(scope, day) if config.sticky_fallback_enabled else None
                passed = sticky.passed if sticky else frozenset()
            total = report.scope_cost(scope, day, spends)
            fired += evaluate_and_fire(config, day, spends, passed, now, total)
        except Exception:  # noqa: BLE001 - one scope's failure must not stop the others' alerts
            logger.exception("alert evaluation failed", extra={"scope": scope, "day": day})
    return fired


def spend_pcts(report: RunReport, now: datetime) -> list[float]:
    """The share of each daily quota used (boosts included) for every evaluated scope of its
    current day: the ``SpendPct`` metric, how close scopes are to being cut off now. Past days,
    stale scopes and (logged) unreadable configs are left out: a metric must not fail the run."""
    pcts: list[float] = []
    for (scope, day), spends in report.evaluated_spends().items():
        try:
            config = boosts.boosted_config(*keys.split_scope(scope), now)
        except Exception:  # noqa: BLE001 - logged; the other scopes still count
            logger.exception("spend % of quota not computed", extra={"scope": scope, "day": day})
            continue
        if config.scope != scope or day != org_day(config.timezone, now):
            continue
        quotas = [(spends.get(label, 0), config.quota(label)) for label in config.model_ordering]
        quotas.append((report.scope_cost(scope, day, spends), config.total_quota))
        pcts += [quota_pct(spend, quota) for spend, quota in quotas if quota > 0]
    return pcts


def list_alerts(org_id: str, date_text: str | None) -> dict:
    """Alerts recorded for an org-local day (default today), of every quota scope of the org."""
    config = orgs.effective_config(org_id)
    day = (
        reports.parse_date(date_text, "date").strftime("%Y%m%d") if date_text is not None else org_day(config.timezone)
    )
    scopes = [config.scope]
    if config.quota_scope == "APP":
        scopes += [keys.scope_key(org_id, item["app_id"], "APP") for item in config_items.app_items(org_id)]
    found = alert_records.of_day_many(scopes, day)
    rows = sorted(
        (record_fields(item, LISTED_FIELDS) for item in found),
        key=lambda row: (row["fired_at"], row["scope"], row["type"], row["label"] or "", row["threshold_pct"] or 0),
    )
    return {"date": parse_day(day).isoformat(), "alerts": rows}
