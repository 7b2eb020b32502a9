"""Temporary quota boosts: N micro-USD added to one label's daily quota until an expiry.

A boost raises the quota counter the org's ``quota_scope`` uses (the org's, or one app's: ``app_id`` required). It is
a Config item plus an entry of the ``quota_boosts`` map on the scope's own item, written together; readers take the
boosts from that map, which comes with the config they read anyway. Expired entries linger (TTL is late), so every
read filters by expiry: a boost counts until the moment it expires.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from .. import audit
from ..bodies import BoostRequest
from ..config import get_config
from ..errors import ApiError, invalid_request, not_found, service_unavailable
from ..store import boosts as boost_store
from ..store import config_items, keys, tables
from ..timeutil import iso_utc
from . import orgs

MAX_BOOST_DAYS = 7
MAX_ACTIVE_BOOSTS = 20  # per quota: its item keeps them (~70 B each)
CREATE_ATTEMPTS = 3  # a concurrent boost of the same quota changed its item first


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


def _check_target(org_id: str, request: BoostRequest) -> tuple[orgs.EffectiveConfig, dict]:
    """The boosted scope's effective config and its own item; 404/400 when the boost cannot apply."""
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
    return config, app if request.app_id else org


def create(org_id: str, request: BoostRequest, now: datetime | None = None) -> dict:
    """Store a boost (its item and its entry on the scope's item, one transaction) and return it."""
    now = now or datetime.now(UTC)
    audit.note(app_id=request.app_id, model_label=request.model_label, amount_usd_micros=request.amount_usd_micros)
    expires = parse_expiry(request.expires_at, now)
    boost = {
        "boost_id": str(uuid.uuid4()),
        "org_id": org_id,
        "app_id": request.app_id,
        "model_label": request.model_label,
        "amount_usd_micros": request.amount_usd_micros,
        "expires_at": iso_utc(expires),
        "created_at": iso_utc(now),
    }
    audit.note(boost_id=boost["boost_id"], expires_at=boost["expires_at"])
    item = {
        "org_key": keys.org_key(org_id),
        **{name: value for name, value in boost.items() if name != "org_id" and value is not None},
        tables.TTL_ATTRIBUTE: int(expires.timestamp()),
        "created_at_epoch": int(now.timestamp()),
    }
    for _ in range(CREATE_ATTEMPTS):
        if _store(org_id, request, item, now):
            orgs.forget(org_id, request.app_id)
            return boost
    raise service_unavailable("Concurrent boosts of this quota kept changing it; retry")


def _store(org_id: str, request: BoostRequest, item: dict, now: datetime) -> bool:
    """One attempt to write ``item`` and its entry on the scope's item (read afresh); False when
    that changed in between, 400 at ``MAX_ACTIVE_BOOSTS`` active boosts."""
    config, scope_item = _check_target(org_id, request)
    stored = boost_store.entries_of(scope_item)
    active = {boost_id: entry for boost_id, entry in stored.items() if entry[2] > now.timestamp()}
    if len(active) >= MAX_ACTIVE_BOOSTS:
        raise invalid_request(
            f"At most {MAX_ACTIVE_BOOSTS} boosts of one quota may be active at once",
            limit=MAX_ACTIVE_BOOSTS,
            active=len(active),
        )
    return boost_store.create(
        {**item, "resource_key": keys.boost_prefix(config.quota_scope, request.app_id) + item["boost_id"]},
        {"org_key": scope_item["org_key"], "resource_key": scope_item["resource_key"]},
        expired=[boost_id for boost_id in stored if boost_id not in active],
        room=MAX_ACTIVE_BOOSTS + len(stored) - len(active),
    )


def active_boosts(config: orgs.EffectiveConfig, now: datetime) -> dict[str, int]:
    """Micro-USD to add to each label's daily quota of ``config``'s scope at ``now``."""
    totals: dict[str, int] = {}
    for label, amount, expires_at_epoch in config.boosts.values():
        if expires_at_epoch > now.timestamp():
            totals[label] = totals.get(label, 0) + amount
    return totals


def apply(quotas: dict, boosts: dict) -> dict:
    """``quotas`` raised by ``boosts``, as a new dict (a label without a quota gets the boost)."""
    boosted = {label: int(amount) for label, amount in quotas.items()}
    for label, amount in boosts.items():
        boosted[label] = boosted.get(label, 0) + amount
    return boosted


def boosted_config(org_id: str, app_id: str | None, now: datetime) -> orgs.EffectiveConfig:
    config = orgs.effective_config(org_id, app_id)
    extra = active_boosts(config, now)
    return config._replace(quotas=apply(config.quotas, extra)) if extra else config
