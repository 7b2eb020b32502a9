"""Daily aggregates: ``GET .../aggregates/today`` and ``.../aggregates/{date}`` for an org
or an app, read from DailyTotal (one BatchGetItem, which also fetches the aggregator's
heartbeat for ``X-Data-Lag-Secs``).

Org aggregates of an APP-scoped org sum its apps. The models map covers the labels of the
orderings and quotas, and every other label a scope lists as spent on that day, read in a
second BatchGetItem up to ``MAX_KEYS_OUTSIDE_ORDERINGS`` keys (``models_omitted`` counts the
rest). DailyTotal is never scanned.
"""

from __future__ import annotations

from datetime import datetime
from itertools import accumulate

from ..cache import etag
from ..errors import not_found
from ..store import config_items, daily_totals, keys, usage
from ..timeutil import iso_utc, org_date, utc_now
from . import boosts, orgs, profiles, reports
from .aggregation import Totals, read_daily_totals, scope_totals
from .orgs import EffectiveConfig
from .quota import Total, decide, quota_pct, quota_status
from .selection import read_sticky

CACHE_CONTROL = "max-age=30, private"
# (app, label) keys outside the orderings one answer reads: a few BatchGetItems, a reply far below 6 MB.
MAX_KEYS_OUTSIDE_ORDERINGS = 1_000


def _labels_and_scopes(config: EffectiveConfig, whole_org_of_apps: bool) -> tuple[list[str], list[str]]:
    """The labels of the orderings and quotas, and the scopes summed: every app's of an APP-scoped
    org (one paginated Config Query), else the config's own."""
    labels = [*config.model_ordering, *config.quotas]
    if not whole_org_of_apps:
        return list(dict.fromkeys(labels)), [config.scope]
    apps = config_items.app_items(config.org_id, ["model_ordering"])
    labels += [label for item in apps for label in item.get("model_ordering") or ()]
    return list(dict.fromkeys(labels)), [keys.scope_key(config.org_id, item["app_id"], "APP") for item in apps]


def _labels_to_show(listed: dict[str, set[str]], read: set[str]) -> tuple[dict[str, list[str]], int]:
    """Of the labels the scopes list (``listed``: by scope) that were not ``read``, the ones shown with
    the scopes listing each, in label order within ``MAX_KEYS_OUTSIDE_ORDERINGS`` keys; and how many
    are left out."""
    scopes_of: dict[str, list[str]] = {}
    for scope, labels in listed.items():
        for label in labels - read:
            scopes_of.setdefault(label, []).append(scope)
    labels = sorted(scopes_of)
    keys_read = accumulate(len(scopes_of[label]) for label in labels)
    fitting = sum(1 for count in keys_read if count <= MAX_KEYS_OUTSIDE_ORDERINGS)
    return {label: scopes_of[label] for label in labels[:fitting]}, len(labels) - fitting


def _model_entry(config: EffectiveConfig, label: str, totals: Totals, bedrock_id: str | None) -> dict:
    quota = config.quota(label)
    return {
        "label": label,
        "bedrock_model_id": bedrock_id,
        "cost_usd_micros": totals.cost_usd_micros,
        "reserved_usd_micros": totals.reserved,
        "quota_usd_micros": quota,
        "quota_pct": quota_pct(totals.cost_usd_micros, quota),
        "quota_status": quota_status(totals.cost_usd_micros, quota, config.tight_mode_threshold_pct),
        **{name: getattr(totals, name) for name in usage.COUNTERS[1:]},  # the tokens and requests
        "average_cost_per_request": (
            (2 * totals.cost_usd_micros + totals.requests) // (2 * totals.requests) if totals.requests else 0
        ),
    }


def _sum(totals: list[Totals]) -> Totals:
    return Totals(committed=sum(t.committed for t in totals), settled=sum(t.settled for t in totals)).plus(totals)


def daily_aggregates(org_id: str, app_id: str | None, date_text: str | None = None) -> tuple[dict, dict]:
    """(body, headers) of an org's or app's aggregates of a day; 404 for a past day without data."""
    now = utc_now()
    config = boosts.boosted_config(org_id, app_id, now)
    today = org_date(config.timezone, now)
    wanted = today if date_text is None else reports.parse_date(date_text, "date", today)
    day = wanted.strftime("%Y%m%d")
    whole_org_of_apps = app_id is None and config.quota_scope == "APP"
    labels, scopes = _labels_and_scopes(config, whole_org_of_apps)
    total_keys = [keys.scope_total_key(scope) for scope in scopes]
    # config labels the scope totals leave apart are not listed on them: read, shown if spent on
    apart = [label for label in orgs.config_labels_ever() if label not in labels]
    usage_keys = [*(keys.usage_key(scope, label) for scope in scopes for label in [*labels, *apart]), *total_keys]
    read = read_daily_totals(usage_keys, day, include_heartbeat=True).with_ledgers(usage_keys, day)
    if wanted != today and not read.totals:
        raise not_found(
            "No data available for specified date",
            date=wanted.isoformat(),
            reason="Data expired (TTL) or date predates org registration",
        )
    found = dict(read.totals)
    # labels outside every ordering (self-registered profiles, dropped labels), per scope listing them
    listing_apart = [scope for scope in scopes if read.listed_apart(scope, labels)]
    listed = dict(zip(listing_apart, daily_totals.spent_labels(listing_apart, wanted, wanted), strict=True))
    shown, omitted = _labels_to_show(listed, {*labels, *apart})
    if shown:
        unread_keys = [keys.usage_key(scope, label) for label, listing in shown.items() for scope in listing]
        found.update(read_daily_totals(unread_keys, day, ledgers=read.reserving).totals)
    spent_apart = {label for label in apart for scope in scopes if keys.usage_key(scope, label) in found}
    labels += sorted(spent_apart | set(shown))
    per_label = {
        label: _sum([found.get(keys.usage_key(scope, label), Totals()) for scope in scopes]) for label in labels
    }
    sticky = read_sticky(config.scope, day) if config.sticky_fallback_enabled and not whole_org_of_apps else None
    spends = {label: totals.cost_usd_micros for label, totals in per_label.items()}
    # every label's spend, or the scopes' (the scope total may count labels beyond the listed ones)
    total_cost = max(
        sum(spends.values()),
        sum(scope_totals(scope, lambda key: found.get(key, Totals())).cost_usd_micros for scope in scopes),
    )
    total_quota = sum(config.quota(label) for label in labels) if whole_org_of_apps else config.total_quota
    decision = decide(
        config.model_ordering,
        config.quotas,
        spends,
        config.tight_mode_threshold_pct,
        config.sticky_fallback_enabled,
        sticky,
        Total(total_cost, total_quota),
    )
    bedrock_ids = profiles.bedrock_ids(config, labels)
    models = {label: _model_entry(config, label, per_label[label], bedrock_ids[label]) for label in labels}
    updated = _sum(list(per_label.values())).updated_at_epoch or read.last_run_epoch
    body = {
        "org_id": org_id,
        **({"app_id": app_id, "app_name": config.app_name} if app_id is not None else {}),
        "date": wanted.isoformat(),
        "timezone": config.timezone,
        "quota_scope": config.quota_scope,
        "models": models,
        "total_cost_usd_micros": total_cost,
        "total_reserved_usd_micros": sum(read.of(key).reserved for key in total_keys),
        "total_quota_usd_micros": total_quota,
        "total_quota_pct": quota_pct(total_cost, total_quota),
        "sticky_fallback_active": sticky is not None and sticky.applies_to(config.model_ordering),
        "current_active_model": decision.label,
        "updated_at": iso_utc(datetime.fromtimestamp(updated, now.tzinfo)) if updated else None,
        "models_omitted": omitted,
    }
    headers = {"Cache-Control": CACHE_CONTROL, "ETag": etag(org_id, app_id, day, models, decision.label)}
    if read.last_run_epoch is not None:
        headers["X-Data-Lag-Secs"] = str(max(0, int(now.timestamp()) - read.last_run_epoch))
    return body, headers
