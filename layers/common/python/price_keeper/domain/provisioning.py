"""Provisioning: creating and updating orgs and apps, rotating their client secrets and revoking their tokens.

Each request is validated completely, then makes one conditional write, so a rejected request changes nothing and two
concurrent ones never both issue credentials: an update (``attribute_exists``) is tried first, else a create that
issues the one-time secret (the loser of a create race updates). PUT replaces the configuration (left-out org settings
return to the defaults, left-out app settings are inherited); ``agg_shard_count`` is immutable; ``timezone`` and
``quota_scope`` cannot change while today has spend. See docs/provisioning.md.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from .. import audit
from ..bodies import ORG_ONLY_SETTINGS, AppRequest, OrgRequest
from ..config import get_config
from ..errors import ApiError, invalid_config, not_found
from ..metric_names import CLIENT_TOKENS_REVOKED
from ..observability import count
from ..store import boosts as boost_store
from ..store import config_items, usage
from ..store import profiles as profile_store
from ..store.dynamo import ConditionFailed
from ..timeutil import is_valid_timezone, iso_utc, next_midnight_utc, org_day, parse_day
from . import auth, orgs

# The wire name of an app override -> its attribute in the app item, where they differ.
ATTRIBUTES = {"refresh_interval_secs": "refresh_interval_normal_secs"}


def _check_labels(ordering: list[str], quotas: dict, valid: list[str], where: str) -> None:
    """Every label known, none repeated, and a quota for every label in the ordering."""
    invalid = list(dict.fromkeys(label for label in [*ordering, *quotas] if label not in valid))
    if invalid:
        quoted = ", ".join(f"'{label}'" for label in invalid)
        raise invalid_config(f"Model label {quoted} not defined in {where}", invalid_labels=invalid, valid_labels=valid)
    repeated = sorted({label for label in ordering if ordering.count(label) > 1})
    if repeated:
        raise invalid_config("model_ordering must not repeat a label", repeated_labels=repeated)
    missing = [label for label in ordering if label not in quotas]
    if missing:
        raise invalid_config("quotas must include every label in model_ordering", missing_quotas=missing)


def _check_org(request: OrgRequest) -> None:
    if not is_valid_timezone(request.timezone):
        raise invalid_config("timezone must be an IANA timezone such as America/New_York", timezone=request.timezone)
    _check_labels(request.model_ordering, request.quotas, list(get_config().labels), "main config")


def _check_app(org_id: str, app_id: str, request: AppRequest, org: dict) -> None:
    own = [name for name in orgs.APP_QUOTA_SETTINGS if getattr(request, name) is not None]
    if own and org["quota_scope"] != "APP":
        raise invalid_config(
            f"{' and '.join(own)} can be set per app only when the organization's quota_scope is APP",
            quota_scope=org["quota_scope"],
        )
    ordering = request.model_ordering or org["model_ordering"]
    quotas = request.quotas if request.quotas is not None else org["quotas"]
    valid = list(get_config().labels)
    if any(label not in valid for label in [*ordering, *quotas]):
        valid += profile_store.labels(org_id, app_id)
    _check_labels(ordering, quotas, valid, "main config or registered as an inference profile of this app")


def _ids(org_id: str, app_id: str | None) -> dict:
    return {"org_id": org_id, **({"app_id": app_id} if app_id else {})}


def _update(key: dict, values: dict, remove: list[str], must_match: dict | None) -> dict | None:
    """Update an existing item and return it; ``None`` when there is none. ``must_match``: immutable
    attributes whose stored value must equal the requested one (else 400 ``INVALID_CONFIG``)."""
    try:
        return config_items.update_existing(key, values, remove, must_match)
    except ConditionFailed as failed:
        changed = {
            name: {"stored": failed.item.get(name), "requested": value}
            for name, value in (must_match or {}).items()
            if failed.item.get(name) != value
        }
        raise invalid_config(f"{', '.join(changed)} cannot be changed after creation", **changed) from None


def _save(
    org_id: str, app_id: str | None, settings: dict, create_only: dict, must_match: dict | None = None
) -> tuple[dict, str | None]:
    """Update the org's or app's config item, or create it with new credentials: (stored item, new
    secret or None). A setting that is None is removed (the body left it out)."""
    key = config_items.client_key(org_id, app_id)
    values = {name: value for name, value in settings.items() if value is not None}
    remove = [name for name, value in settings.items() if value is None]
    stored = _update(key, values, remove, must_match)
    if stored is not None:
        return stored, None
    secret = auth.new_client_secret()
    now = int(time.time())
    item = {
        **key,
        **values,
        **create_only,
        "client_id": auth.client_id_for(org_id, app_id),
        **auth.secret_attributes(secret),
        "client_secret_created_at_epoch": now,
        "created_at_epoch": now,
        "updated_at_epoch": now,
    }
    if config_items.create(item):
        return item, secret
    # Lost a create race: the winner's item exists now and this request updates it.
    return _update(key, values, remove, must_match), None


def _iso(epoch) -> str:
    return iso_utc(datetime.fromtimestamp(int(epoch), UTC))


def _reply(org_id: str, app_id: str | None, stored: dict, secret: str | None, configuration: dict) -> tuple[bool, dict]:
    """(created, response body); the secret appears only on create."""
    if secret is None:
        outcome = {"status": "updated", "updated_at": _iso(stored["updated_at_epoch"])}
    else:
        outcome = {
            "status": "created",
            "created_at": _iso(stored["created_at_epoch"]),
            "credentials": {"client_id": stored["client_id"], "client_secret": secret},
        }
    return secret is not None, {**_ids(org_id, app_id), **outcome, "configuration": configuration}


def _org_settings(request: OrgRequest) -> dict:
    """The org item's settings for this request (service defaults where the body is silent)."""
    defaults = get_config().metering
    overrides = request.overrides

    def given(value, default):
        return default if value is None else value

    return {
        "org_name": request.org_name,
        "timezone": request.timezone,
        "quota_scope": request.quota_scope,
        "model_ordering": list(request.model_ordering),
        "quotas": dict(request.quotas),
        "sticky_fallback_enabled": given(overrides.sticky_fallback_enabled, defaults.sticky_fallback_enabled),
        "tight_mode_threshold_pct": given(overrides.tight_mode_threshold_pct, defaults.tight_mode_threshold_pct),
        "refresh_interval_normal_secs": given(overrides.refresh_interval_secs, defaults.refresh_interval_normal_secs),
        "refresh_interval_tight_secs": defaults.refresh_interval_tight_secs,
        # None: no such setting (removed)
        "total_quota_usd_micros": request.total_quota_usd_micros,
        "app_daily_cap_usd_micros": request.app_daily_cap_usd_micros,
        "alert_thresholds_pct": overrides.alert_thresholds_pct and sorted(set(overrides.alert_thresholds_pct)),
        "rate_limits": overrides.rate_limits and dict(overrides.rate_limits),
        "updated_at_epoch": int(time.time()),
    }


def _check_day_bound_change(org_id: str, stored: dict | None, request: OrgRequest, now: datetime) -> None:
    """409 when the request moves ``timezone`` or ``quota_scope`` while today has spend: either
    would start a new day or counter, leaving the spend behind (docs/metering.md)."""
    if stored is None:
        return
    changed = [name for name in ("timezone", "quota_scope") if stored[name] != getattr(request, name)]
    day = org_day(stored["timezone"], now)
    if changed and usage.org_has_spend(org_id, day):
        raise ApiError(
            409,
            "CONFLICT",
            f"{' and '.join(changed)} cannot change while today has spend",
            {
                "changed": changed,
                "org_day": parse_day(day).isoformat(),
                "timezone": stored["timezone"],
                "next_org_midnight": iso_utc(next_midnight_utc(stored["timezone"], now)),
            },
            hint="Today's spend is counted in the current day and scope; apply the change on a "
            "day without spend (e.g. right after the next org-local midnight, before any usage)",
        )


def _ignored_app_quotas(org_id: str) -> list[str]:
    """Apps whose own quotas (kept from an APP scope) are ignored while the org is ORG-scoped."""
    items = config_items.app_items(org_id, orgs.APP_QUOTA_SETTINGS)
    return sorted(item["app_id"] for item in items if any(name in item for name in orgs.APP_QUOTA_SETTINGS))


def put_org(org_id: str, request: OrgRequest, now: datetime | None = None) -> tuple[bool, dict]:
    """Create or update an org: (created, response body)."""
    _check_org(request)
    stored, _ = config_items.org_and_app(org_id, None)
    _check_day_bound_change(org_id, stored, request, now or datetime.now(UTC))
    shards = request.overrides.agg_shard_count
    stored, secret = _save(
        org_id,
        None,
        _org_settings(request),
        create_only={
            "agg_shard_count": shards or get_config().metering.usage_agg_shard_count,
            boost_store.BOOSTS_ATTRIBUTE: {},
        },
        must_match={"agg_shard_count": shards} if shards else None,
    )
    orgs.forget(org_id)
    configuration = {
        "timezone": stored["timezone"],
        "quota_scope": stored["quota_scope"],
        "model_ordering": stored["model_ordering"],
        "agg_shard_count": int(stored["agg_shard_count"]),
        "total_quota_usd_micros": int(orgs.merge(stored, None, org_id, None).total_quota),
    }
    if stored["quota_scope"] == "ORG" and secret is None:
        configuration["ignored_app_quota_overrides"] = _ignored_app_quotas(org_id)
    return _reply(org_id, None, stored, secret, configuration)


def put_app(org_id: str, app_id: str, request: AppRequest) -> tuple[bool, dict]:
    """Create or update an app of a registered org: (created, response body)."""
    org, _ = config_items.org_and_app(org_id, None)
    if org is None:
        raise ApiError(
            404,
            "NOT_FOUND",
            "Organization not registered",
            {"org_id": org_id},
            hint=f"Call PUT /api/v1/orgs/{org_id} first",
        )
    _check_app(org_id, app_id, request, org)
    # The overridable settings by wire name; None: inherited from the org (removed from the item).
    overrides = {**request.model_dump(exclude={"app_name", "overrides"}), **request.overrides.model_dump()}
    stored, secret = _save(
        org_id,
        app_id,
        {
            "app_name": request.app_name,
            **{ATTRIBUTES.get(name, name): value for name, value in overrides.items()},
            "updated_at_epoch": int(time.time()),
        },
        create_only={boost_store.BOOSTS_ATTRIBUTE: {}},
    )
    orgs.forget(org_id, app_id)
    configuration = {
        "app_name": stored["app_name"],
        "model_ordering": stored.get("model_ordering", org["model_ordering"]),
        "inherited_fields": sorted(ORG_ONLY_SETTINGS) + [name for name, value in overrides.items() if value is None],
    }
    return _reply(org_id, app_id, stored, secret, configuration)


def _write_with_cutoff(org_id: str, app_id: str | None, client_action: dict, cutoff: dict) -> bool:
    written = config_items.write_with_cutoff(client_action, cutoff)
    if written is None:
        raise not_found(
            "Application not registered" if app_id else "Organization not registered", **_ids(org_id, app_id)
        )
    auth.forget_cutoff(auth.client_id_for(org_id, app_id))
    return written


def rotate_credentials(org_id: str, app_id: str | None, grace_period_hours: int) -> dict:
    """Issue a new client secret; the old one (and its tokens) keeps working for ``grace_period_hours``."""
    audit.note(grace_period_hours=grace_period_hours)
    rotated_ms = auth.now_ms()
    now = rotated_ms // 1000
    old_expires = now + grace_period_hours * 3600
    grace_end = old_expires if grace_period_hours else None
    client_id = auth.client_id_for(org_id, app_id)
    cutoff = auth.cutoff_update(client_id, rotated_ms, grace_end)
    while True:  # again only if the new secret's fingerprint equals the current one's (1 in 65,536)
        secret = auth.new_client_secret()
        rotation = config_items.rotation(org_id, app_id, auth.secret_attributes(secret), now, grace_end)
        if _write_with_cutoff(org_id, app_id, rotation, cutoff):
            break
    orgs.forget(org_id, app_id)
    return {
        **_ids(org_id, app_id),
        "client_id": client_id,
        "client_secret": secret,
        "rotation": {
            "rotated_at": _iso(now),
            "old_secret_expires_at": _iso(old_expires),
            "grace_period_hours": grace_period_hours,
        },
    }


def revoke_tokens(org_id: str, app_id: str | None) -> None:
    """End every token issued to the client before now; the secret stays valid."""
    cutoff = auth.cutoff_update(auth.client_id_for(org_id, app_id), auth.now_ms())
    _write_with_cutoff(org_id, app_id, config_items.registered(org_id, app_id), cutoff)
    count(CLIENT_TOKENS_REVOKED)
