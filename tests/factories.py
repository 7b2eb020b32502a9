"""Test data in the exact item shapes of the schema seed (for tests that need an org
without going through the provisioning endpoints)."""

from __future__ import annotations

import time
import uuid

from price_keeper.domain import auth
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table


def seed_org(
    org_id: str | None = None,
    *,
    timezone: str = "America/New_York",
    quota_scope: str = "APP",
    model_ordering=("premium", "standard", "economy"),
    quotas: dict | None = None,
    agg_shard_count: int = 8,
    tight_mode_threshold_pct: int = 95,
    sticky_fallback_enabled: bool = True,
    secret: str = "org-secret",
) -> str:
    org_id = org_id or str(uuid.uuid4())
    now = int(time.time())
    table(tables.CONFIG).put_item(
        Item={
            "org_key": keys.org_key(org_id),
            "resource_key": keys.ROOT_RESOURCE,
            "org_name": "test org",
            "timezone": timezone,
            "quota_scope": quota_scope,
            "model_ordering": list(model_ordering),
            "quotas": quotas or {"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000},
            "sticky_fallback_enabled": sticky_fallback_enabled,
            "agg_shard_count": agg_shard_count,
            "quota_boosts": {},
            "tight_mode_threshold_pct": tight_mode_threshold_pct,
            "refresh_interval_normal_secs": 300,
            "refresh_interval_tight_secs": 60,
            "client_id": auth.client_id_for(org_id),
            **auth.secret_attributes(secret),
            "client_secret_created_at_epoch": now,
            "created_at_epoch": now,
            "updated_at_epoch": now,
        }
    )
    return org_id


def seed_app(org_id: str, app_id: str = "app-1", *, secret: str = "app-secret", **overrides) -> str:
    now = int(time.time())
    table(tables.CONFIG).put_item(
        Item={
            "org_key": keys.org_key(org_id),
            "resource_key": keys.app_resource(app_id),
            "app_name": app_id,
            "client_id": auth.client_id_for(org_id, app_id),
            **auth.secret_attributes(secret),
            "client_secret_created_at_epoch": now,
            "created_at_epoch": now,
            "updated_at_epoch": now,
            "quota_boosts": {},
            **overrides,
        }
    )
    return app_id


def token_for(org_id: str, app_id: str | None = None) -> str:
    """A real access token for the org (``app_id=None``) or app client."""
    return auth.issue_tokens(auth.Principal(org_id, app_id))["access_token"]


def seed_profiles(org_id: str, app_id: str, labels, arn: str) -> None:
    """Profiles of the app registered under ``labels``, all for ``arn``, as registration
    stores them (``profiles.register``), without a Bedrock call each."""
    from price_keeper.store import profiles as profile_store

    now = int(time.time())
    with table(tables.CONFIG).batch_writer() as batch:
        for label in labels:
            batch.put_item(
                Item={
                    **profile_store.profile_key(org_id, app_id, label),
                    "profile_label": label,
                    "inference_profile_arn": arn,
                    "created_at": "2026-01-01T00:00:00Z",
                    "updated_at_epoch": now,
                }
            )
