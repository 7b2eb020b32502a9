"""Model selection: which label a client should call right now, by the pure rules of ``quota``.

It reads what the rules need (StickyState and the DailyTotals in one BatchGetItem, the live items in tight mode),
writes StickyState only when the choice moves forward, and shapes the reply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import suppress
from datetime import datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from ..cache import etag
from ..errors import ApiError
from ..metric_names import STICKY_FLIPS
from ..observability import count
from ..store import daily_totals, keys
from ..store import sticky as sticky_store
from ..store.dynamo import batch_get_many
from ..timeutil import day_start_utc, iso_utc, next_midnight_utc, org_day, parse_day, utc_now
from . import boosts, orgs, pricing, profiles
from .aggregation import DailyRead, scope_totals, scope_usage_keys
from .orgs import EffectiveConfig
from .quota import (
    REASON_APP_EXCEEDED,
    REASON_NORMAL,
    REASON_STICKY,
    REASON_TOTAL_EXCEEDED,
    TIGHT,
    Decision,
    Sticky,
    Total,
    decide,
    quota_pct,
    quota_status,
)

STICKY_GRACE_SECS = 3600  # StickyState lives until the next org-local midnight + 1 h
MAX_STICKY_RACES = 3


def describe(decision: Decision, ordering) -> str:
    if decision.reason == REASON_NORMAL:
        return f"Using {decision.label}: within its daily quota"
    if decision.reason == REASON_STICKY:
        return f"Sticky fallback: staying on {decision.label} for the rest of the org-local day"
    return f"{ordering[decision.index - 1].capitalize()} quota exceeded, using {decision.label} tier"


def _sticky(item: dict | None) -> Sticky | None:
    return Sticky(frozenset(item.get("passed_labels", ()))) if item else None


def read_sticky(scope: str, day: str) -> Sticky | None:
    return _sticky(sticky_store.read(scope, day))


def write_sticky(config: EffectiveConfig, day: str, labels: frozenset[str], now: datetime) -> Sticky:
    """Add ``labels`` (fallen back past) to the day's sticky state; the whole state after."""
    next_midnight = day_start_utc(config.timezone, parse_day(day) + timedelta(days=1))
    passed, added = sticky_store.add_passed(
        config.scope, day, set(labels), int(now.timestamp()), int(next_midnight.timestamp()) + STICKY_GRACE_SECS
    )
    for _ in added:
        count(STICKY_FLIPS)
    return Sticky(frozenset(passed))


class Snapshot(NamedTuple):
    """What one selection read: spends of the ordering's labels and the decision."""

    config: EffectiveConfig
    day: str
    spends: dict[str, int]
    total: Total
    app_total: Total | None  # ORG scope, an app with a daily cap: its own spend against it
    decision: Decision
    reserved: dict[str, int] = {}  # live holds by label (``domain.reservations``), for display
    total_reserved: int = 0
    items: dict[tuple[str, str], dict] = {}  # the DailyTotal items read, by (usage_key, yyyymmdd)


def current_decision(
    config: EffectiveConfig, day: str, now: datetime, consistent: bool = False, also: Iterable[tuple[str, str]] = ()
) -> Snapshot:
    """Decide on one read (with ``also``'s (usage_key, yyyymmdd) totals for the caller), moving sticky state forward
    when needed. In tight mode the lagging totals are topped up with the live items, bounding a burst's overshoot."""
    usage_keys = [keys.usage_key(config.scope, label) for label in config.model_ordering]
    app_counter = config.app_counter if config.app_daily_cap_usd_micros is not None else None
    day_keys = [*usage_keys, *scope_usage_keys(config.scope), *(scope_usage_keys(app_counter) if app_counter else ())]
    totals_read = daily_totals.day_read(day_keys, day)
    extra = [{"usage_key": usage_key, "date_key": keys.day_key(other_day)} for usage_key, other_day in also]
    reads = [totals_read._replace(keys=[*totals_read.keys, *extra])]
    if config.sticky_fallback_enabled:
        reads.append(sticky_store.day_read(config.scope, day))
    found = batch_get_many(reads, consistent=consistent)  # one round trip for both tables
    items = {(item["usage_key"], keys.day_of_key(item["date_key"])): item for item in found[0]}
    totals = DailyRead.from_items(item for (_, item_day), item in items.items() if item_day == day)
    totals = totals.with_ledgers(day_keys, day)
    sticky = _sticky(found[1][0]) if config.sticky_fallback_enabled and found[1] else None
    of_label = dict(zip(config.model_ordering, map(totals.of, usage_keys), strict=True))
    spends = {label: label_totals.cost_usd_micros for label, label_totals in of_label.items()}
    reserved = {label: label_totals.reserved for label, label_totals in of_label.items()}
    total_reserved = totals.of(keys.scope_total_key(config.scope)).reserved
    # The scope's spend over every label; never below the ordering's own sum (the scope total may lag it).
    scope_spend = scope_totals(config.scope, totals.of).cost_usd_micros
    total = Total(max(scope_spend, sum(spends.values())), config.total_quota)
    app_total = None
    if app_counter:
        app_total = Total(scope_totals(app_counter, totals.of).cost_usd_micros, config.app_daily_cap_usd_micros)

    def decide_now(state: Sticky | None, held: bool = True) -> Decision:
        """The rules over the spends, with ``held`` the live holds too: holds shape the answer,
        but only spend passes a label for the day (a hold may yet be given back)."""
        return decide(
            config.model_ordering,
            config.quotas,
            {label: spend + (reserved[label] if held else 0) for label, spend in spends.items()},
            config.tight_mode_threshold_pct,
            config.sticky_fallback_enabled,
            state,
            total._replace(spend=total.spend + (total_reserved if held else 0)),
            app_total,
        )

    if decide_now(sticky).mode == TIGHT:  # each label's total plus its live items not folded yet
        live = daily_totals.live_costs(usage_keys, day)
        unfolded = {label: max(0, live.get(keys.usage_key(config.scope, label), 0)) for label in spends}
        spends = {label: spend + unfolded[label] for label, spend in spends.items()}
        total = total._replace(spend=total.spend + sum(unfolded.values()))
    for _ in range(MAX_STICKY_RACES):
        passed = decide_now(sticky, held=False).newly_passed
        if not passed:
            break
        sticky = write_sticky(config, day, passed, now)
    decision = decide_now(sticky)
    return Snapshot(config, day, spends, total, app_total, decision, reserved, total_reserved, items)


def models_status(config: EffectiveConfig, spends: dict[str, int], reserved: dict[str, int]) -> dict:
    return {
        label: {
            "spend_usd_micros": spends.get(label, 0),
            "reserved_usd_micros": reserved.get(label, 0),
            "quota_usd_micros": config.quota(label),
            "quota_pct": quota_pct(spends.get(label, 0), config.quota(label)),
            "status": quota_status(spends.get(label, 0), config.quota(label), config.tight_mode_threshold_pct),
        }
        for label in config.model_ordering
    }


def _pricing(config: EffectiveConfig, label: str, day: str) -> dict:
    """The chosen label's price of the day; ``source: UNAVAILABLE`` when it cannot be priced now."""
    if profiles.known_label(config, label) is not None:
        with suppress(ApiError):
            return pricing.price_of(profiles.priced_model(config, label, None), parse_day(day)).as_response()
    return {"version": parse_day(day).isoformat(), "source": "UNAVAILABLE"}


def _total_status(total: Total | None, reserved: int = 0) -> dict | None:
    """A cap's status; ``reserved`` what live reservations hold of it (the app caps: none)."""
    if total is None:
        return None
    return {
        "spend_usd_micros": total.spend,
        "reserved_usd_micros": reserved,
        "quota_usd_micros": total.quota,
        "quota_pct": quota_pct(total.spend, total.quota),
        "exceeded": total.spend >= total.quota,
    }


def all_exceeded(snapshot: Snapshot, now: datetime) -> ApiError:
    config, spends = snapshot.config, snapshot.spends
    retry_at = next_midnight_utc(config.timezone, now)
    message = {
        REASON_TOTAL_EXCEEDED: "Daily total quota exceeded for today",
        REASON_APP_EXCEEDED: "Daily app quota exceeded for today",
    }.get(snapshot.decision.reason, "All model quotas exceeded for today")
    return ApiError(
        429,
        "QUOTA_EXCEEDED",
        message,
        {
            "org_id": config.org_id,
            "app_id": config.app_id,
            "date": parse_day(snapshot.day).isoformat(),
            "models": {
                label: {
                    "quota_pct": quota_pct(spends.get(label, 0), config.quota(label)),
                    "exceeded": spends.get(label, 0) >= config.quota(label),
                }
                for label in config.model_ordering
            },
            "total_overage_usd_micros": sum(
                max(0, spends.get(label, 0) - config.quota(label)) for label in config.model_ordering
            ),
            "total": _total_status(snapshot.total, snapshot.total_reserved),
            "app_total": _total_status(snapshot.app_total),
        },
        headers={"Retry-After": str(max(1, math.ceil((retry_at - now) / timedelta(seconds=1))))},
        retry_after=iso_utc(retry_at),
    )


def select_model(org_id: str, app_id: str, force_check: bool = False, now: datetime | None = None) -> tuple[dict, dict]:
    """``GET .../model-selection``; ``force_check`` re-reads the config, strongly consistent."""
    now = now or utc_now()
    if force_check:
        orgs.forget(org_id, app_id)
    return recommend(boosts.boosted_config(org_id, app_id, now), now, consistent=force_check)


class Carried(NamedTuple):
    """The selection a usage answer carries, and the DailyTotal items read with it."""

    selection: dict | None  # None: every label is spent (the endpoint's 429 has the details)
    items: dict[tuple[str, str], dict]  # by (usage_key, yyyymmdd)


def carried(config: EffectiveConfig, now: datetime, also: Iterable[tuple[str, str]]) -> Carried:
    snapshot = current_decision(config, org_day(config.timezone, now), now, also=also)
    return Carried(answer(snapshot, now)[0] if snapshot.decision.index is not None else None, snapshot.items)


def recommend(config: EffectiveConfig, now: datetime, consistent: bool = False) -> tuple[dict, dict]:
    return answer(current_decision(config, org_day(config.timezone, now), now, consistent=consistent), now)


def answer(snapshot: Snapshot, now: datetime) -> tuple[dict, dict]:
    """(body, headers) of the selection ``snapshot`` decided; 429 ``QUOTA_EXCEEDED`` when all is spent."""
    config, day, decision = snapshot.config, snapshot.day, snapshot.decision
    org_id, app_id = config.org_id, config.app_id
    if decision.index is None:
        raise all_exceeded(snapshot, now)
    label = decision.label
    spend, quota = snapshot.spends.get(label, 0), config.quota(label)
    secs = config.refresh_interval_tight_secs if decision.mode == TIGHT else config.refresh_interval_normal_secs
    body = {
        "org_id": org_id,
        "app_id": app_id,
        "recommended_model": {
            "label": label,
            "bedrock_model_id": profiles.bedrock_id(config, label),
            "reason": decision.reason,
            "description": describe(decision, config.model_ordering),
        },
        "quota_status": {
            "scope": config.quota_scope,
            "mode": decision.mode,
            "current_model": label,
            "spend_usd_micros": spend,
            "reserved_usd_micros": snapshot.reserved.get(label, 0),
            "quota_usd_micros": quota,
            "quota_pct": quota_pct(spend, quota),
            "sticky_fallback_active": decision.sticky_active,
            "models_status": models_status(config, snapshot.spends, snapshot.reserved),
            "total": _total_status(snapshot.total, snapshot.total_reserved),
            "app_total": _total_status(snapshot.app_total),
        },
        "pricing": _pricing(config, label, day),
        "client_guidance": {
            "check_frequency": f"PERIODIC_{secs}S",
            "cache_duration_secs": secs,
            "explanation": (
                f"In TIGHT mode - check every {secs} seconds for faster fallback detection"
                if decision.mode == TIGHT
                else f"In NORMAL mode - check every {secs} seconds"
            ),
        },
        "checked_at": iso_utc(now),
        "org_day": day,
        "org_local_time": now.astimezone(ZoneInfo(config.timezone)).replace(microsecond=0).isoformat(),
    }
    state = (decision.reason, decision.mode, snapshot.spends, snapshot.total, snapshot.app_total)
    headers = {"Cache-Control": f"max-age={secs}, private", "ETag": etag(org_id, app_id, day, label, *state)}
    return body, headers
