"""Temporary quota boosts: N micro-USD added to one label's daily quota until an expiry.

A boost raises exactly one quota counter, the one the org's ``quota_scope`` uses: in an
ORG-scoped org the org's quota (no ``app_id``), in an APP-scoped org one app's quota
(``app_id`` required). Boosts are Config items beside the org's own items::

    org_key      = ORG#{org_id}
    resource_key = BOOST#ORG#{boost_id}                 (ORG-scoped orgs)
                   BOOST#APP#{app_id}#{boost_id}        (APP-scoped orgs)

so the boosts of one quota scope are one ``Query`` (``begins_with`` the scope's prefix;
app ids cannot contain ``#``, so ``app-1`` never matches ``app-10``). ``expires_at_epoch``
is the table's TTL attribute: DynamoDB deletes the item by itself after the expiry, but
up to 48 h late, so every read also filters by expiry.

A boost applies to every day it overlaps, for as long as it has not expired: a boost
expiring at 15:00 counts in selection and aggregates until 15:00 and not after.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import Field, StringConstraints

from .. import audit
from ..cache import TTLCache
from ..config import get_config
from ..errors import ApiError, invalid_request, not_found
from ..store import boosts as boost_store
from ..store import config_items, keys, tables
from ..timeutil import iso_utc
from ..validation import APP_ID_PATTERN, StrictBody
from . import orgs

MAX_BOOST_DAYS = 7
MAX_AMOUNT_USD_MICROS = 2**63 - 1  # CostAmount is a 64-bit integer
BOOST_CACHE_SECONDS = 30

# (org_id, app_id | None, quota_scope) -> [(label, amount, expires_at_epoch)], unfiltered:
# expiry is checked at every call, so a cached boost stops counting exactly at its expiry.
_cache = TTLCache(BOOST_CACHE_SECONDS)


class BoostRequest(StrictBody):
    model_label: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)]
    amount_usd_micros: Annotated[int, Field(gt=0, le=MAX_AMOUNT_USD_MICROS)]
    expires_at: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="ISO 8601 time with a UTC offset, in the future and at most 7 days ahead"
    )
    app_id: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)] | None = Field(
        None, description="Required when the org's quota_scope is APP; not allowed when it is ORG"
    )


def parse_expiry(value: str, now: datetime) -> datetime:
    """The expiry as an aware UTC datetime; 400 unless it is in (now, now + 7 days]."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise invalid_request(
            "expires_at must be an ISO 8601 time such as 2026-01-23T18:00:00Z", expires_at=value
        ) from None
    if moment.tzinfo is None:
        raise invalid_request("expires_at must include a UTC offset (Z or +hh:mm)", expires_at=value)
    latest = now + timedelta(days=MAX_BOOST_DAYS)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC, 9999-12-31T23:00-14:00 after 9999
        raise invalid_request(
            f"expires_at must be in the future and at most {MAX_BOOST_DAYS} days ahead",
            expires_at=value,
            now=iso_utc(now),
            latest=iso_utc(latest),
        ) from None
    if moment <= now:
        raise invalid_request("expires_at must be in the future", expires_at=value, now=iso_utc(now))
    if moment > latest:
        raise invalid_request(
            f"expires_at must be at most {MAX_BOOST_DAYS} days ahead", expires_at=value, latest=iso_utc(latest)
        )
    return moment


def _check_target(org_id: str, request: BoostRequest) -> orgs.EffectiveConfig:
    """The effective config of the boosted scope; 404/400 when the boost cannot apply."""
    org, app = config_items.org_and_app(org_id, request.app_id)  # consistent reads: an admin write, no stale cache
    if org is None:
        raise not_found("Organization not registered", org_id=org_id)
    if request.app_id and app is None:
        raise not_found("Application not registered", org_id=org_id, app_id=request.app_id)
    if org["quota_scope"] == "ORG" and request.app_id:
        raise invalid_request(
            "The organization's quota_scope is ORG: a boost raises the org quota, omit app_id", quota_scope="ORG"
        )
    if org["quota_scope"] == "APP" and not request.app_id:
        raise invalid_request(
            "The organization's quota_scope is APP: name the app whose quota to boost", quota_scope="APP"
        )
    config = orgs.merge(org, app, org_id, request.app_id)
    known = list(dict.fromkeys([*get_config().labels, *config.model_ordering]))
    if request.model_label not in known:
        raise ApiError(
            400,
            "INVALID_MODEL_LABEL",
            f"Model label '{request.model_label}' is not configured",
            {"model_label": request.model_label, "valid_labels": known},
        )
    return config


def create(org_id: str, request: BoostRequest, now: datetime | None = None) -> dict:
    """Store a boost (one PutItem after every check passed) and return it as the API shows it."""
    now = now or datetime.now(UTC)
    audit.note(app_id=request.app_id, model_label=request.model_label, amount_usd_micros=request.amount_usd_micros)
    expires = parse_expiry(request.expires_at, now)
    config = _check_target(org_id, request)
    boost_id = str(uuid.uuid4())
    audit.note(boost_id=boost_id, expires_at=iso_utc(expires))
    item = {
        "org_key": keys.org_key(org_id),
        "resource_key": keys.boost_prefix(config.quota_scope, request.app_id) + boost_id,
        "boost_id": boost_id,
        "model_label": request.model_label,
        "amount_usd_micros": request.amount_usd_micros,
        "expires_at": iso_utc(expires),
        tables.TTL_ATTRIBUTE: int(expires.timestamp()),
        "created_at": iso_utc(now),
        "created_at_epoch": int(now.timestamp()),
    }
    if request.app_id:
        item["app_id"] = request.app_id
    boost_store.create(item)
    _cache.discard((org_id, request.app_id, config.quota_scope))
    return {
        "boost_id": boost_id,
        "org_id": org_id,
        "app_id": request.app_id,
        "model_label": request.model_label,
        "amount_usd_micros": request.amount_usd_micros,
        "expires_at": item["expires_at"],
        "created_at": item["created_at"],
    }


def _load(org_id: str, app_id: str | None, quota_scope: str) -> list[tuple[str, int, int]]:
    return [
        (item["model_label"], int(item["amount_usd_micros"]), int(item[tables.TTL_ATTRIBUTE]))
        for item in boost_store.of_quota(org_id, app_id, quota_scope)
    ]


def active_boosts(org_id: str, app_id: str | None, quota_scope: str, now: datetime) -> dict[str, int]:
    """Micro-USD to add to each label's daily quota at ``now``, for the quota of one scope.

    For model selection and aggregates: pass the effective config's ``org_id``, ``app_id``
    and ``quota_scope`` (an ORG-scoped org ignores ``app_id``; an APP-scoped org with
    ``app_id=None`` has no org-wide quota to boost and gets ``{}``), then
    ``apply(config.quotas, active_boosts(...))`` gives the quotas to compare spend with.
    One Config Query per scope, cached in memory for ``BOOST_CACHE_SECONDS``: a new boost
    reaches other warm containers within that; an expired one stops counting at once.
    """
    if quota_scope == "APP" and app_id is None:
        return {}
    scope_app = app_id if quota_scope == "APP" else None
    boosts = _cache.get_or_load((org_id, scope_app, quota_scope), lambda: _load(org_id, scope_app, quota_scope))
    cutoff = now.timestamp()
    totals: dict[str, int] = {}
    for label, amount, expires_at_epoch in boosts:
        if expires_at_epoch > cutoff:
            totals[label] = totals.get(label, 0) + amount
    return totals


def apply(quotas: dict, boosts: dict) -> dict:
    """``quotas`` (label -> micro-USD) raised by ``boosts`` (from ``active_boosts``); a new dict.

    A boosted label without a quota of its own gets the boost as its quota.
    """
    boosted = {label: int(amount) for label, amount in quotas.items()}
    for label, amount in boosts.items():
        boosted[label] = boosted.get(label, 0) + amount
    return boosted


def boosted_config(org_id: str, app_id: str | None, now: datetime) -> orgs.EffectiveConfig:
    """The effective config with the boosts active at ``now`` added to its quotas: what
    model selection, aggregates and the usage response compare spend against."""
    config = orgs.effective_config(org_id, app_id)
    extra = active_boosts(config.org_id, config.app_id, config.quota_scope, now)
    return config._replace(quotas=apply(config.quotas, extra)) if extra else config
