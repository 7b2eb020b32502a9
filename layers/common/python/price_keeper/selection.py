"""Model selection: which label a client should call right now.

The rules are pure functions over (ordering, quotas, spends, sticky state) so they are
testable without AWS; the store layer below reads the StickyState item and the DailyTotals
in one BatchGetItem, and writes StickyState only when the choice moves forward.

- The choice is the first label in ``model_ordering`` whose spend is under its quota.
- Sticky fallback (when enabled): once a later label is chosen because earlier ones are
  spent, StickyState records it for the org-local day with the seed's conditional write
  (``attribute_not_exists(active_model_label) OR active_model_index < :new_index``), so the
  choice only moves forward during a day, never back (reason ``STICKY_FALLBACK`` when an
  earlier label would be available again, e.g. after a quota raise).
- Tight mode: the chosen label's spend is at or above ``tight_mode_threshold_pct`` of its
  quota; clients then poll at the tight refresh interval.
- Every label spent, or the scope's total over all labels (``total_quota``, which spend
  on any label counts toward, in the ordering or not) reached: 429 ``QUOTA_EXCEEDED``
  until the next org-local midnight. Tight mode also when the total is near its cap.
"""
from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from botocore.exceptions import ClientError

from . import boosts, keys, orgs, pricing, profiles, tables
from .aggregation import DailyRead, daily_totals_read
from .aws import table
from .errors import ApiError
from .live_spend import live_spend
from .metric_names import STICKY_FLIPS
from .observability import count
from .orgs import EffectiveConfig
from .storage import Read, batch_get_many
from .timeutil import day_start_utc, iso_utc, next_midnight_utc, org_day, parse_day, utc_now

NORMAL, TIGHT, EXCEEDED = "NORMAL", "TIGHT", "EXCEEDED"
REASON_NORMAL = "NORMAL"
REASON_STICKY = "STICKY_FALLBACK"
REASON_ALL_EXCEEDED = "ALL_QUOTAS_EXCEEDED"
REASON_TOTAL_EXCEEDED = "TOTAL_QUOTA_EXCEEDED"
STICKY_GRACE_SECS = 3600  # StickyState lives until the next org-local midnight + 1 h


def exceeded_reason(label: str) -> str:
    return f"QUOTA_EXCEEDED_{label.upper()}"


def quota_pct(spend: int, quota: int) -> float | None:
    """Spend as a percentage of quota, to one decimal (half up); None without a quota."""
    if quota <= 0:
        return None
    tenths = (spend * 2000 + quota) // (2 * quota)
    return tenths / 10


def quota_status(spend: int, quota: int, threshold_pct: int) -> str:
    if spend >= quota:
        return EXCEEDED
    if spend * 100 >= threshold_pct * quota:
        return TIGHT
    return NORMAL


class Sticky(NamedTuple):
    label: str
    index: int


class Decision(NamedTuple):
    index: int | None  # position of the chosen label in the ordering; None: every label is spent
    label: str | None
    reason: str
    mode: str  # NORMAL | TIGHT of the chosen label
    sticky_active: bool
    flip_to: int | None  # StickyState index to write (the choice moved forward)


class Total(NamedTuple):
    """A scope's spend over every label of the day against its total cap."""

    spend: int
    quota: int


def decide(ordering: tuple[str, ...] | list[str], quotas: dict[str, int], spends: dict[str, int],
           threshold_pct: int, sticky_enabled: bool, sticky: Sticky | None, total: Total | None = None) -> Decision:
    """The selection rules (pure). ``spends`` may omit labels with no spend yet."""
    def spend(label: str) -> int:
        return spends.get(label, 0)


    available = [i for i, label in enumerate(ordering) if spend(label) < quotas.get(label, 0)]
    floor = ordering.index(sticky.label) if sticky_enabled and sticky and sticky.label in ordering else 0
    chosen = next((i for i in available if i >= floor), None)
    if chosen is None:
        return Decision(None, None, REASON_ALL_EXCEEDED, EXCEEDED, sticky_enabled and floor > 0, None)
    if total is not None and total.spend >= total.quota:
        return Decision(None, None, REASON_TOTAL_EXCEEDED, EXCEEDED, sticky_enabled and floor > 0, None)
    label = ordering[chosen]
    if chosen == 0:
        reason = REASON_NORMAL
    elif chosen == floor and any(i < floor for i in available):
        reason = REASON_STICKY
    else:
        reason = exceeded_reason(ordering[chosen - 1])
    flip_to = chosen if sticky_enabled and chosen > floor else None
    tight = quota_status(spend(label), quotas.get(label, 0), threshold_pct) == TIGHT or (
        total is not None and quota_status(total.spend, total.quota, threshold_pct) == TIGHT)
    mode = TIGHT if tight else NORMAL
    return Decision(chosen, label, reason, mode, sticky_enabled and chosen > 0, flip_to)


def describe(decision: Decision, ordering) -> str:
    if decision.reason == REASON_NORMAL:
        return f"Using {decision.label}: within its daily quota"
    if decision.reason == REASON_STICKY:
        return f"Sticky fallback: staying on {decision.label} for the rest of the org-local day"
    return f"{ordering[decision.index - 1].capitalize()} quota exceeded, using {decision.label} tier"


def refresh_secs(config: EffectiveConfig, mode: str) -> int:
    return config.refresh_interval_tight_secs if mode == TIGHT else config.refresh_interval_normal_secs


# --- the store layer ---------------------------------------------------------------

STICKY_ATTRIBUTES = ("active_model_label", "active_model_index")


def _sticky_key(scope: str, day: str) -> dict:
    return {"scope_key": scope, "date_key": keys.day_key(day)}


def _sticky(item: dict | None) -> Sticky | None:
    return Sticky(item["active_model_label"], int(item["active_model_index"])) if item else None


def read_sticky(scope: str, day: str, consistent: bool = False) -> Sticky | None:
    return _sticky(table(tables.STICKY_STATE).get_item(
        Key=_sticky_key(scope, day), ConsistentRead=consistent,
        ProjectionExpression=", ".join(STICKY_ATTRIBUTES)).get("Item"))


def write_sticky(config: EffectiveConfig, day: str, index: int, now: datetime) -> bool:
    """Move the day's sticky state forward to ``index``; False when another writer already
    moved it as far or further (the seed's conditional write)."""
    next_midnight = day_start_utc(config.timezone, parse_day(day) + timedelta(days=1))
    item = {
        **_sticky_key(config.scope, day),
        "active_model_label": config.model_ordering[index], "active_model_index": index,
        "reason": "QUOTA_EXCEEDED", "previous_model_label": config.model_ordering[index - 1],
        "activated_at_epoch": int(now.timestamp()),
        tables.TTL_ATTRIBUTE: int(next_midnight.timestamp()) + STICKY_GRACE_SECS,
    }
    try:
        table(tables.STICKY_STATE).put_item(
            Item=item,
            ConditionExpression="attribute_not_exists(active_model_label) OR active_model_index < :new_index",
            ExpressionAttributeValues={":new_index": index})
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        return False
    count(STICKY_FLIPS)
    return True


class Snapshot(NamedTuple):
    """What one selection read: spends of the ordering's labels and the decision."""

    config: EffectiveConfig
    day: str
    spends: dict[str, int]
    total: Total
    decision: Decision


MAX_STICKY_RACES = 3


def current_decision(config: EffectiveConfig, day: str, now: datetime, consistent: bool = False) -> Snapshot:
    """Read sticky state and totals (one BatchGetItem), decide, and move sticky state
    forward when needed.

    In tight mode the DailyTotals (up to one aggregation interval old) are not trusted:
    the live shards are read too (one BatchGetItem) and the larger spend counts, which
    bounds a burst's overshoot past the quota (``benchmarks/overshoot.py``).
    When the conditional write loses a race, the state is re-read and the decision made
    again over the winner's state.
    """
    usage_keys = [keys.usage_key(config.scope, label) for label in config.model_ordering]
    total_key = keys.scope_total_key(config.scope)
    reads = [daily_totals_read([*usage_keys, total_key], day)]
    if config.sticky_fallback_enabled:
        reads.append(Read(tables.STICKY_STATE, [_sticky_key(config.scope, day)], STICKY_ATTRIBUTES))
    found = batch_get_many(reads, consistent=consistent)  # one round trip for both tables
    totals = DailyRead.from_items(found[0])
    sticky = _sticky(found[1][0]) if config.sticky_fallback_enabled and found[1] else None
    spends = {label: totals.of(key).cost_usd_micros for label, key in zip(config.model_ordering, usage_keys)}
    # The scope total folds every label; never below the ordering's own sum (it may lag it).
    total = Total(max(totals.of(total_key).cost_usd_micros, sum(spends.values())), config.total_quota)

    def decide_now(state: Sticky | None) -> Decision:
        return decide(config.model_ordering, config.quotas, spends, config.tight_mode_threshold_pct,
                      config.sticky_fallback_enabled, state, total)

    decision = decide_now(sticky)
    if decision.mode == TIGHT:
        live = live_spend(config.scope, config.model_ordering, day, config.agg_shard_count)
        unfolded = sum(max(0, live[label] - spend) for label, spend in spends.items())
        spends = {label: max(spend, live[label]) for label, spend in spends.items()}
        total = total._replace(spend=total.spend + unfolded)
        decision = decide_now(sticky)
    for _ in range(MAX_STICKY_RACES):
        if decision.flip_to is None or write_sticky(config, day, decision.flip_to, now):
            break
        decision = decide_now(read_sticky(config.scope, day, consistent=True))
    return Snapshot(config, day, spends, total, decision)


def models_status(config: EffectiveConfig, spends: dict[str, int]) -> dict:
    return {
        label: {
            "spend_usd_micros": spends.get(label, 0),
            "quota_usd_micros": config.quota(label),
            "quota_pct": quota_pct(spends.get(label, 0), config.quota(label)),
            "status": quota_status(spends.get(label, 0), config.quota(label), config.tight_mode_threshold_pct),
        }
        for label in config.model_ordering
    }


def _pricing(config: EffectiveConfig, label: str, day: str) -> dict:
    """The chosen label's price of the day; ``source: UNAVAILABLE`` when it cannot be
    priced right now (a profile whose routing Bedrock does not answer)."""
    version = parse_day(day).isoformat()
    if profiles.known_label(config, label) is None:
        return {"version": version, "source": "UNAVAILABLE"}
    try:
        priced = profiles.priced_model(config, label, None)
        return pricing.price_of(priced, parse_day(day)).as_response()
    except ApiError:
        return {"version": version, "source": "UNAVAILABLE"}


def _etag(*parts) -> str:
    return '"' + hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=8).hexdigest() + '"'


def _total_status(total: Total) -> dict:
    return {"spend_usd_micros": total.spend, "quota_usd_micros": total.quota,
            "quota_pct": quota_pct(total.spend, total.quota), "exceeded": total.spend >= total.quota}


def all_exceeded(config: EffectiveConfig, snapshot: Snapshot, now: datetime) -> ApiError:
    retry_at = next_midnight_utc(config.timezone, now)
    spends, total = snapshot.spends, snapshot.total
    message = ("Daily total quota exceeded for today" if snapshot.decision.reason == REASON_TOTAL_EXCEEDED
               else "All model quotas exceeded for today")
    return ApiError(
        429, "QUOTA_EXCEEDED", message,
        {
            "org_id": config.org_id, "app_id": config.app_id, "date": parse_day(snapshot.day).isoformat(),
            "models": {label: {"quota_pct": quota_pct(spends.get(label, 0), config.quota(label)),
                               "exceeded": spends.get(label, 0) >= config.quota(label)}
                       for label in config.model_ordering},
            "total_overage_usd_micros": sum(max(0, spends.get(label, 0) - config.quota(label))
                                            for label in config.model_ordering),
            "total": _total_status(total),
        },
        headers={"Retry-After": str(max(1, math.ceil((retry_at - now) / timedelta(seconds=1))))},
        retry_after=iso_utc(retry_at),
    )


def select_model(org_id: str, app_id: str, force_check: bool = False, now: datetime | None = None) -> tuple[dict, dict]:
    """(body, headers) of ``GET .../model-selection``; 429 ``QUOTA_EXCEEDED`` when every
    label is spent. ``force_check`` re-reads the config and reads strongly consistent."""
    now = now or utc_now()
    if force_check:
        orgs.forget(org_id, app_id)
    config = boosts.boosted_config(org_id, app_id, now)
    day = org_day(config.timezone, now)
    snapshot = current_decision(config, day, now, consistent=force_check)
    decision = snapshot.decision
    if decision.index is None:
        raise all_exceeded(config, snapshot, now)
    label = decision.label
    spend, quota = snapshot.spends.get(label, 0), config.quota(label)
    secs = refresh_secs(config, decision.mode)
    body = {
        "org_id": org_id,
        "app_id": app_id,
        "recommended_model": {"label": label, "bedrock_model_id": profiles.bedrock_id(config, label),
                              "reason": decision.reason, "description": describe(decision, config.model_ordering)},
        "quota_status": {
            "scope": config.quota_scope, "mode": decision.mode, "current_model": label,
            "spend_usd_micros": spend, "quota_usd_micros": quota, "quota_pct": quota_pct(spend, quota),
            "sticky_fallback_active": decision.sticky_active,
            "models_status": models_status(config, snapshot.spends),
            "total": _total_status(snapshot.total),
        },
        "pricing": _pricing(config, label, day),
        "client_guidance": {
            "check_frequency": f"PERIODIC_{secs}S", "cache_duration_secs": secs,
            "explanation": (f"In TIGHT mode - check every {secs} seconds for faster fallback detection"
                            if decision.mode == TIGHT else f"In NORMAL mode - check every {secs} seconds"),
        },
        "checked_at": iso_utc(now),
        "org_day": day,
        "org_local_time": now.astimezone(ZoneInfo(config.timezone)).replace(microsecond=0).isoformat(),
    }
    headers = {"Cache-Control": f"max-age={secs}, private",
               "ETag": _etag(org_id, app_id, day, label, decision.reason, decision.mode, snapshot.spends,
                             snapshot.total)}
    return body, headers
