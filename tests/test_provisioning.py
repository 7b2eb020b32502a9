"""PUT /api/v1/orgs/{org_id} and PUT /api/v1/orgs/{org_id}/apps/{app_id}: every validation
rule, create vs update, the stored item shapes, and no write when a request is refused."""

import base64
import hashlib
import json
import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta

import bcrypt
import pytest

from price_keeper.bodies import UsageRequest
from price_keeper.domain import auth, metering, orgs
from price_keeper.store import config_items, keys, tables
from price_keeper.store.dynamo import ddb_client, table
from tests.conftest import PROVISIONING_KEY, assert_error
from tests.factories import seed_app, seed_org
from tests.provisioned import APP_BODY, ORG_BODY, config_item, new_app, new_org, org_body, put_app, put_org, tokens
from tests.usage_support import usage_body

# --- orgs: create and update ----------------------------------------------------------


def test_create_returns_201_with_one_time_credentials(api):
    org_id = str(uuid.uuid4())
    reply = put_org(api, org_id)
    assert reply.status == 201, reply
    body = reply.json()
    assert body["org_id"] == org_id and body["status"] == "created"
    assert body["created_at"].endswith("Z")
    assert body["credentials"]["client_id"] == f"org-{org_id}"
    assert len(base64.b64decode(body["credentials"]["client_secret"], validate=True)) == 32
    assert body["configuration"] == {
        "timezone": "America/New_York",
        "quota_scope": "APP",
        "model_ordering": ["premium", "standard", "economy"],
        "agg_shard_count": 8,
        "total_quota_usd_micros": 17_000_000,
    }  # the sum of the label quotas


def test_org_item_has_exactly_the_seed_shape(api):
    org_id, credentials = new_org(api)
    stored = config_item(org_id)
    # the seed's and the org quota's boosts (store.boosts), none yet
    seeded = config_item(seed_org())
    assert set(stored) == set(seeded)
    assert stored["quota_boosts"] == {}
    for name, value in seeded.items():
        assert type(stored[name]) is type(value), name
    assert stored["org_key"] == f"ORG#{org_id}" and stored["resource_key"] == "#"
    assert stored["client_id"] == credentials["client_id"]
    assert stored["refresh_interval_normal_secs"] == 300 and stored["refresh_interval_tight_secs"] == 60
    assert stored["sticky_fallback_enabled"] is True


def test_client_secret_is_stored_only_as_a_bcrypt_hash(api):
    org_id, credentials = new_org(api)
    stored = config_item(org_id)
    assert credentials["client_secret"] not in repr(stored)
    assert stored["client_secret_hash"].startswith("$2b$")
    assert bcrypt.checkpw(credentials["client_secret"].encode(), stored["client_secret_hash"].encode())


def test_update_returns_200_without_new_credentials_and_keeps_the_secret(api):
    org_id, credentials = new_org(api)
    before = config_item(org_id)
    reply = put_org(
        api,
        org_id,
        org_body(
            org_name="renamed",
            timezone="Europe/Paris",
            quota_scope="ORG",
            model_ordering=["standard"],
            quotas={"standard": 7},
        ),
    )
    assert reply.status == 200, reply
    body = reply.json()
    assert body["status"] == "updated" and "credentials" not in body and body["updated_at"].endswith("Z")
    assert body["configuration"] == {
        "timezone": "Europe/Paris",
        "quota_scope": "ORG",
        "model_ordering": ["standard"],
        "agg_shard_count": 8,
        "total_quota_usd_micros": 7,
        "ignored_app_quota_overrides": [],
    }
    after = config_item(org_id)
    assert after["org_name"] == "renamed" and after["quotas"] == {"standard": 7}
    for unchanged in ("client_secret_hash", "client_id", "created_at_epoch", "client_secret_created_at_epoch"):
        assert after[unchanged] == before[unchanged]
    tokens(api, credentials)


def test_put_replaces_settings_left_out_return_to_defaults(api):
    org_id, _ = new_org(
        api,
        overrides={
            "tight_mode_threshold_pct": 60,
            "sticky_fallback_enabled": False,
            "refresh_interval_secs": 30,
            "agg_shard_count": 16,
        },
    )
    stored = config_item(org_id)
    assert (
        stored["tight_mode_threshold_pct"],
        stored["sticky_fallback_enabled"],
        stored["refresh_interval_normal_secs"],
        stored["agg_shard_count"],
    ) == (60, False, 30, 16)
    assert put_org(api, org_id, org_body(overrides={})).status == 200
    stored = config_item(org_id)
    assert (
        stored["tight_mode_threshold_pct"],
        stored["sticky_fallback_enabled"],
        stored["refresh_interval_normal_secs"],
    ) == (95, True, 300)
    assert stored["agg_shard_count"] == 16  # kept: it can never change


def test_shard_count_is_immutable_after_creation(api):
    org_id, _ = new_org(api)
    before = config_item(org_id)
    reply = put_org(api, org_id, org_body(org_name="changed", overrides={"agg_shard_count": 32}))
    body = assert_error(reply, 400, "INVALID_CONFIG")
    assert body["details"]["agg_shard_count"] == {"stored": 8, "requested": 32}
    assert config_item(org_id) == before
    assert put_org(api, org_id, org_body(overrides={"agg_shard_count": 8})).status == 200


def test_shard_count_check_is_one_conditional_write_not_a_read_then_write(api):
    org_id = seed_org(agg_shard_count=64)
    calls = []
    ddb_client().meta.events.register("before-call.dynamodb", lambda model, **kw: calls.append(model.name))
    assert_error(put_org(api, org_id, org_body(overrides={"agg_shard_count": 8})), 400, "INVALID_CONFIG")
    # the read is the stored org (for the timezone / scope rule); the shard count is checked
    # by the conditional update alone, so no write can slip between a read and the check
    assert calls == ["BatchGetItem", "UpdateItem"]
    assert config_item(org_id)["org_name"] == "test org"


def test_a_create_never_overwrites_an_existing_org(api):
    org_id = seed_org()
    before = config_item(org_id)
    assert config_items.create({**before, "org_name": "intruder"}) is False
    assert config_item(org_id) == before


def test_concurrent_creates_issue_exactly_one_secret(api):
    org_id = str(uuid.uuid4())
    replies = []

    def create():
        replies.append(put_org(api, org_id))

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(reply.status for reply in replies) == [200] * 5 + [201]
    created = next(reply for reply in replies if reply.status == 201)
    tokens(api, created.json()["credentials"])


def test_refresh_interval_secs_is_the_normal_interval(api):
    org_id, _ = new_org(api, overrides={"refresh_interval_secs": 120})
    config = orgs.effective_config(org_id)
    assert config.refresh_interval_normal_secs == 120 and config.refresh_interval_tight_secs == 60


def test_the_same_process_sees_an_update_at_once(api):
    org_id, _ = new_org(api)
    assert orgs.effective_config(org_id).model_ordering == ("premium", "standard", "economy")
    put_org(api, org_id, org_body(model_ordering=["economy"]))
    assert orgs.effective_config(org_id).model_ordering == ("economy",)


@pytest.mark.parametrize("threshold", [50, 100])
def test_threshold_bounds_are_accepted(api, threshold):
    org_id, _ = new_org(api, overrides={"tight_mode_threshold_pct": threshold})
    assert config_item(org_id)["tight_mode_threshold_pct"] == threshold


# --- orgs: every refused request is a 400 and writes nothing ----------------------------

INVALID_ORG_BODIES = {
    "timezone not IANA": (org_body(timezone="Mars/Olympus_Mons"), "INVALID_CONFIG"),
    "timezone abbreviation": (org_body(timezone="Eastern"), "INVALID_CONFIG"),
    "unknown label": (
        org_body(model_ordering=["premium", "unknown_label"], quotas={"premium": 1, "unknown_label": 1}),
        "INVALID_CONFIG",
    ),
    "unknown label only in quotas": (org_body(quotas={**org_body()["quotas"], "nope": 1}), "INVALID_CONFIG"),
    "label without quota": (org_body(quotas={"premium": 1, "standard": 1}), "INVALID_CONFIG"),
    "repeated label": (org_body(model_ordering=["premium", "premium"]), "INVALID_CONFIG"),
    "empty ordering": (org_body(model_ordering=[]), "INVALID_REQUEST"),
    "ordering not a list": (org_body(model_ordering="premium"), "INVALID_REQUEST"),
    "quota scope": (org_body(quota_scope="TEAM"), "INVALID_REQUEST"),
    "negative quota": (org_body(quotas={"premium": -1, "standard": 1, "economy": 1}), "INVALID_REQUEST"),
    "quota as string": (org_body(quotas={"premium": "5", "standard": 1, "economy": 1}), "INVALID_REQUEST"),
    "fractional quota": (org_body(quotas={"premium": 1.5, "standard": 1, "economy": 1}), "INVALID_REQUEST"),
    "quota beyond 64 bits": (org_body(quotas={"premium": 2**63, "standard": 1, "economy": 1}), "INVALID_REQUEST"),
    "threshold below 50": (org_body(overrides={"tight_mode_threshold_pct": 49}), "INVALID_REQUEST"),
    "threshold above 100": (org_body(overrides={"tight_mode_threshold_pct": 101}), "INVALID_REQUEST"),
    "threshold as bool": (org_body(overrides={"tight_mode_threshold_pct": True}), "INVALID_REQUEST"),
    "shard count 12": (org_body(overrides={"agg_shard_count": 12}), "INVALID_REQUEST"),
    "sticky not bool": (org_body(overrides={"sticky_fallback_enabled": "yes"}), "INVALID_REQUEST"),
    "sticky as 1": (org_body(overrides={"sticky_fallback_enabled": 1}), "INVALID_REQUEST"),
    "refresh interval 0": (org_body(overrides={"refresh_interval_secs": 0}), "INVALID_REQUEST"),
    "refresh interval negative": (org_body(overrides={"refresh_interval_secs": -5}), "INVALID_REQUEST"),
    "unknown override": (org_body(overrides={"tight_mode": 90}), "INVALID_REQUEST"),
    "unknown field": (org_body(owner="someone"), "INVALID_REQUEST"),
    "overrides null": (org_body(overrides=None), "INVALID_REQUEST"),
    "org name missing": ({k: v for k, v in org_body().items() if k != "org_name"}, "INVALID_REQUEST"),
    "quotas missing": ({k: v for k, v in org_body().items() if k != "quotas"}, "INVALID_REQUEST"),
    "org name blank": (org_body(org_name="   "), "INVALID_REQUEST"),
    "org name huge": (org_body(org_name="x" * 201), "INVALID_REQUEST"),
    "label huge": (org_body(model_ordering=["p" * 100_000], quotas={"p" * 100_000: 1}), "INVALID_REQUEST"),
    "malformed json": ('{"org_name": "x",', "INVALID_REQUEST"),
    "empty body": ("", "INVALID_REQUEST"),
}


@pytest.mark.parametrize("body,code", INVALID_ORG_BODIES.values(), ids=INVALID_ORG_BODIES.keys())
def test_invalid_org_put_is_400_and_writes_nothing(api, body, code):
    unknown_org = str(uuid.uuid4())
    assert_error(put_org(api, unknown_org, body), 400, code)
    assert config_item(unknown_org) is None
    org_id, _ = new_org(api)
    before = config_item(org_id)
    assert_error(put_org(api, org_id, body), 400, code)
    assert config_item(org_id) == before


def test_unknown_label_error_names_the_valid_labels(api):
    body = assert_error(
        put_org(api, str(uuid.uuid4()), org_body(model_ordering=["unknown_label"], quotas={"unknown_label": 1})),
        400,
        "INVALID_CONFIG",
    )
    assert body["message"] == "Model label 'unknown_label' not defined in main config"
    assert body["details"] == {
        "invalid_labels": ["unknown_label"],
        "valid_labels": ["premium", "standard", "economy", "ultra_premium"],
    }


def test_missing_quota_error_names_the_labels(api):
    body = assert_error(put_org(api, str(uuid.uuid4()), org_body(quotas={"premium": 1})), 400, "INVALID_CONFIG")
    assert body["details"] == {"missing_quotas": ["standard", "economy"]}


@pytest.mark.parametrize(
    "org_id", ["not-a-uuid", "550e8400e29b41d4a716446655440000", "550e8400-e29b-41d4-a716-44665544000g", "x" * 300]
)
def test_org_id_must_be_a_uuid(api, org_id):
    assert_error(put_org(api, org_id), 400, "INVALID_REQUEST")
    assert table(tables.CONFIG).scan()["Items"] == []


@pytest.mark.parametrize("api_key", [None, "wrong-key", "test-provisioning-key-and-more"])
def test_org_put_needs_the_provisioning_key(api, api_key):
    org_id = str(uuid.uuid4())
    headers = {} if api_key is None else {"X-API-Key": api_key}
    reply = api.put(f"/api/v1/orgs/{org_id}", org_body(), headers=headers)
    assert_error(reply, 401, "UNAUTHORIZED")
    assert config_item(org_id) is None


def test_a_client_token_is_not_a_provisioning_key(api):
    org_id, credentials = new_org(api)
    access = tokens(api, credentials)["access_token"]
    assert_error(api.put(f"/api/v1/orgs/{org_id}", org_body(), token=access), 401, "UNAUTHORIZED")


def test_non_json_content_type_is_400(api):
    reply = api.put(
        f"/api/v1/orgs/{uuid.uuid4()}",
        org_body(),
        api_key="test-provisioning-key",
        headers={"Content-Type": "text/plain"},
    )
    assert_error(reply, 400, "INVALID_REQUEST")


# --- apps ------------------------------------------------------------------------------


def test_app_create_returns_201_with_app_credentials(api):
    org_id, _ = new_org(api)
    reply = put_app(api, org_id, "app-production-api")
    assert reply.status == 201, reply
    body = reply.json()
    assert body["org_id"] == org_id and body["app_id"] == "app-production-api" and body["status"] == "created"
    assert body["credentials"]["client_id"] == f"org-{org_id}-app-app-production-api"
    assert body["configuration"] == {
        "app_name": "Production API",
        "model_ordering": ["premium", "standard"],
        "inherited_fields": [
            "agg_shard_count",
            "quota_scope",
            "sticky_fallback_enabled",
            "timezone",
            "total_quota_usd_micros",
            "app_daily_cap_usd_micros",
            "refresh_interval_secs",
        ],
    }
    token = tokens(api, body["credentials"])
    assert token["scope"] == f"org:{org_id} app:app-production-api"


def test_app_item_has_the_seed_shape_and_no_plaintext_secret(api):
    org_id, _ = new_org(api)
    credentials = new_app(api, org_id, "app-1")
    stored = config_item(org_id, "app-1")
    assert set(stored) == {
        "org_key",
        "resource_key",
        "app_name",
        "model_ordering",
        "quotas",
        "tight_mode_threshold_pct",
        "client_id",
        "client_secret_hash",
        "client_secret_fingerprint",
        "client_secret_created_at_epoch",
        "created_at_epoch",
        "updated_at_epoch",
        "quota_boosts",  # the app quota's boosts (store.boosts), none yet
    }
    assert stored["quota_boosts"] == {}
    assert set(stored) - {"model_ordering", "quotas", "tight_mode_threshold_pct"} == set(
        config_item(org_id, seed_app(org_id, "seeded"))
    )
    assert credentials["client_secret"] not in repr(stored)
    assert bcrypt.checkpw(credentials["client_secret"].encode(), stored["client_secret_hash"].encode())


def test_app_update_is_200_and_left_out_settings_inherit_from_the_org(api):
    org_id, credentials = new_org(api)
    app_credentials = new_app(api, org_id, "app-1")
    reply = put_app(api, org_id, "app-1", {"app_name": "Renamed"})
    assert reply.status == 200, reply
    body = reply.json()
    assert body["status"] == "updated" and "credentials" not in body
    assert body["configuration"]["model_ordering"] == ["premium", "standard", "economy"]
    assert body["configuration"]["inherited_fields"][-6:] == [
        "model_ordering",
        "quotas",
        "total_quota_usd_micros",
        "app_daily_cap_usd_micros",
        "tight_mode_threshold_pct",
        "refresh_interval_secs",
    ]
    stored = config_item(org_id, "app-1")
    assert "model_ordering" not in stored and "quotas" not in stored and "tight_mode_threshold_pct" not in stored
    config = orgs.effective_config(org_id, "app-1")
    assert config.app_name == "Renamed" and config.tight_mode_threshold_pct == 95
    assert config.quotas == {"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000}
    tokens(api, app_credentials)


def test_app_overrides_reach_the_effective_config_at_once(api):
    org_id, _ = new_org(api)
    new_app(api, org_id, "app-1", {"app_name": "A"})
    assert orgs.effective_config(org_id, "app-1").tight_mode_threshold_pct == 95
    put_app(
        api, org_id, "app-1", {**APP_BODY, "overrides": {"tight_mode_threshold_pct": 70, "refresh_interval_secs": 45}}
    )
    config = orgs.effective_config(org_id, "app-1")
    assert (config.tight_mode_threshold_pct, config.refresh_interval_normal_secs) == (70, 45)
    assert config.model_ordering == ("premium", "standard") and config.timezone == "America/New_York"


def test_app_of_an_unregistered_org_is_404_with_a_hint(api):
    org_id = str(uuid.uuid4())
    body = assert_error(put_app(api, org_id, "app-1"), 404, "NOT_FOUND")
    assert body["details"] == {"org_id": org_id}
    assert body["hint"] == f"Call PUT /api/v1/orgs/{org_id} first"
    assert table(tables.CONFIG).scan()["Items"] == []


@pytest.mark.parametrize("app_id", ["-starts-with-dash", "has%23hash", "has.colon:", "a" * 65, "sp ace"])
def test_app_id_must_match_the_pattern(api, app_id):
    org_id, _ = new_org(api)
    assert_error(put_app(api, org_id, app_id), 400, "INVALID_REQUEST")
    assert len(table(tables.CONFIG).scan()["Items"]) == 1


def test_app_id_of_64_characters_is_accepted(api):
    org_id, _ = new_org(api)
    new_app(api, org_id, "A1._-" + "x" * 59)


INVALID_APP_BODIES = {
    "name missing": ({"model_ordering": ["premium"]}, "INVALID_REQUEST"),
    "name huge": ({"app_name": "x" * 201}, "INVALID_REQUEST"),
    "timezone": ({"app_name": "A", "timezone": "Europe/Paris"}, "INVALID_REQUEST"),
    "quota scope": ({"app_name": "A", "quota_scope": "ORG"}, "INVALID_REQUEST"),
    "shard count in overrides": ({"app_name": "A", "overrides": {"agg_shard_count": 8}}, "INVALID_REQUEST"),
    "sticky in overrides": ({"app_name": "A", "overrides": {"sticky_fallback_enabled": False}}, "INVALID_REQUEST"),
    "unknown field": ({"app_name": "A", "colour": "blue"}, "INVALID_REQUEST"),
    "threshold out of range": ({"app_name": "A", "overrides": {"tight_mode_threshold_pct": 20}}, "INVALID_REQUEST"),
    "refresh interval 0": ({"app_name": "A", "overrides": {"refresh_interval_secs": 0}}, "INVALID_REQUEST"),
    "empty ordering": ({"app_name": "A", "model_ordering": []}, "INVALID_REQUEST"),
    "unknown label": ({"app_name": "A", "model_ordering": ["mystery"], "quotas": {"mystery": 1}}, "INVALID_CONFIG"),
    "ordering label without an org quota": ({"app_name": "A", "model_ordering": ["ultra_premium"]}, "INVALID_CONFIG"),
    "app quotas that miss an inherited label": ({"app_name": "A", "quotas": {"premium": 1}}, "INVALID_CONFIG"),
    "malformed json": ("{", "INVALID_REQUEST"),
}


@pytest.mark.parametrize("body,code", INVALID_APP_BODIES.values(), ids=INVALID_APP_BODIES.keys())
def test_invalid_app_put_is_400_and_writes_nothing(api, body, code):
    org_id, _ = new_org(api)
    assert_error(put_app(api, org_id, "new-app", body), 400, code)
    assert config_item(org_id, "new-app") is None
    new_app(api, org_id, "app-1")
    before = config_item(org_id, "app-1")
    assert_error(put_app(api, org_id, "app-1", body), 400, code)
    assert config_item(org_id, "app-1") == before


def test_org_only_settings_are_named_in_the_error(api):
    org_id, _ = new_org(api)
    body = assert_error(
        put_app(api, org_id, "app-1", {"app_name": "A", "timezone": "UTC", "quota_scope": "ORG"}),
        400,
        "INVALID_REQUEST",
    )
    assert "quota_scope, timezone always come(s) from the organization" in body["details"]["errors"][0]["msg"]


def test_a_label_with_its_own_quota_may_extend_the_ordering(api):
    org_id, _ = new_org(api)
    new_app(
        api,
        org_id,
        "app-1",
        {"app_name": "A", "model_ordering": ["ultra_premium", "premium"], "quotas": {"ultra_premium": 9, "premium": 1}},
    )
    assert orgs.effective_config(org_id, "app-1").quotas == {"ultra_premium": 9, "premium": 1}


def test_app_quotas_need_an_app_scoped_org(api):
    org_id, _ = new_org(api, quota_scope="ORG")
    body = assert_error(put_app(api, org_id, "app-1"), 400, "INVALID_CONFIG")
    assert body["details"] == {"quota_scope": "ORG"}
    new_app(api, org_id, "app-1", {"app_name": "A", "model_ordering": ["standard"]})


def _register_profile(org_id: str, app_id: str, label: str) -> None:
    """An inference-profile item in the seed's shape (registration is another endpoint)."""
    table(tables.CONFIG).put_item(
        Item={
            "org_key": keys.profile_org_key(org_id, app_id),
            "resource_key": keys.profile_resource(label),
            "profile_label": label,
            "inference_profile_arn": f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{label}",
            "created_at": "2026-01-23T15:30:45Z",
            "updated_at_epoch": 1737640245,
        }
    )


def test_registered_inference_profile_labels_are_valid_for_their_app_only(api):
    org_id, _ = new_org(api)
    _register_profile(org_id, "app-1", "tenant-a-premium")
    body = {
        "app_name": "A",
        "model_ordering": ["tenant-a-premium", "premium"],
        "quotas": {"tenant-a-premium": 3, "premium": 1},
    }
    assert put_app(api, org_id, "app-1", body).status == 201
    refused = assert_error(put_app(api, org_id, "app-2", body), 400, "INVALID_CONFIG")
    assert refused["details"]["invalid_labels"] == ["tenant-a-premium"]
    assert "tenant-a-premium" not in refused["details"]["valid_labels"]


@pytest.mark.parametrize("api_key", [None, "wrong-key"])
def test_app_put_needs_the_provisioning_key(api, api_key):
    org_id, _ = new_org(api)
    headers = {} if api_key is None else {"X-API-Key": api_key}
    reply = api.put(f"/api/v1/orgs/{org_id}/apps/app-1", APP_BODY, headers=headers)
    assert_error(reply, 401, "UNAUTHORIZED")
    assert config_item(org_id, "app-1") is None


def test_apps_of_two_orgs_with_the_same_id_are_separate(api):
    org_a, _ = new_org(api)
    org_b, _ = new_org(api)
    credentials_a = new_app(api, org_a, "shared-name")
    credentials_b = new_app(api, org_b, "shared-name")
    assert credentials_a["client_id"] != credentials_b["client_id"]
    wrong = {"client_id": credentials_b["client_id"], "client_secret": credentials_a["client_secret"]}
    assert_error(api.post("/auth/token", {**wrong, "grant_type": "client_credentials"}), 401, "UNAUTHORIZED")
    assert auth.parse_client_id(credentials_a["client_id"]) == auth.Principal(org_a, "shared-name")


def test_org_id_must_be_lower_case_so_one_org_has_one_key(api):
    org_id = "550E8400-E29B-41D4-A716-446655440000"
    assert_error(put_org(api, org_id), 400, "INVALID_REQUEST")
    assert put_org(api, org_id.lower()).status == 201


# --- changes that move the day or the counters (docs/metering.md "Integrity rules") ----------


def test_a_request_id_stays_a_duplicate_across_a_scope_change(api):
    """Dedup names the app, not the quota scope: a call counted yesterday in the app's scope
    is still a duplicate today in the org's scope (the change itself is allowed: today has
    no spend yet)."""
    org_id, _ = new_org(api)
    token = tokens(api, new_app(api, org_id, "app-1"))["access_token"]
    yesterday = datetime.now(UTC) - timedelta(days=1)
    body = usage_body(timestamp=(yesterday - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    first = metering.submit(org_id, "app-1", UsageRequest.model_validate(body), now=yesterday)
    assert first["duplicate"] is False
    moved = put_org(api, org_id, org_body(quota_scope="ORG"))
    assert moved.status == 200, moved
    assert moved.json()["configuration"]["ignored_app_quota_overrides"] == ["app-1"]
    again = api.post(f"/api/v1/orgs/{org_id}/apps/app-1/usage", body, token=token)
    assert again.status == 202 and again.json()["duplicate"] is True, again


def test_app_quotas_from_an_app_scope_are_ignored_in_an_org_scope(api):
    org_id, _ = new_org(api)
    token = tokens(api, new_app(api, org_id, "app-1"))["access_token"]  # APP_BODY: premium 50 USD a day
    assert put_org(api, org_id, org_body(quota_scope="ORG")).status == 200
    status = api.get(f"/api/v1/orgs/{org_id}/apps/app-1/model-selection", token=token).json()["quota_status"]
    assert status["quota_usd_micros"] == ORG_BODY["quotas"]["premium"]  # the org's counter and quota
    reply = put_app(api, org_id, "app-1", {"app_name": "x", "total_quota_usd_micros": 5})
    body = assert_error(reply, 400, "INVALID_CONFIG")
    assert (
        body["message"] == "total_quota_usd_micros can be set per app only when the organization's quota_scope is APP"
    )


def test_a_timezone_or_scope_change_is_409_while_today_has_spend_and_changes_nothing(api):
    org_id, _ = new_org(api)
    token = tokens(api, new_app(api, org_id, "app-1"))["access_token"]
    # (a ledger day, not folded yet: its first record lists the day's spend itself)
    assert api.post(f"/api/v1/orgs/{org_id}/apps/app-1/usage", usage_body(), token=token).status == 202
    before = config_item(org_id)
    for change in ({"timezone": "Pacific/Kiritimati"}, {"quota_scope": "ORG"}):
        body = assert_error(put_org(api, org_id, org_body(**change)), 409, "CONFLICT")
        assert body["details"]["changed"] == list(change) and body["details"]["timezone"] == "America/New_York"
    assert config_item(org_id) == before
    assert put_org(api, org_id, org_body(org_name="renamed")).status == 200  # other settings still change


def test_the_total_cap_is_stored_and_returns_to_the_default_when_left_out(api):
    org_id, _ = new_org(api, total_quota_usd_micros=12_345)
    assert config_item(org_id)["total_quota_usd_micros"] == 12_345
    reply = put_org(api, org_id, org_body())
    assert reply.json()["configuration"]["total_quota_usd_micros"] == sum(ORG_BODY["quotas"].values())
    assert "total_quota_usd_micros" not in config_item(org_id)


# --- the audit trail ---------------------------------------------------------------------


_RECORD_ATTRIBUTES = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def audit_lines(caplog) -> list[dict]:
    """The audit lines logged since the last call: the fields each carries."""
    lines = [
        {name: value for name, value in vars(record).items() if name not in _RECORD_ATTRIBUTES}
        for record in caplog.records
        if record.getMessage() == "audit"
    ]
    caplog.clear()
    return lines


def summary(line: dict) -> tuple:
    return line["action"], line["outcome"], line["status"], line.get("error")


def test_every_provisioning_action_logs_one_audit_line(api, caplog):
    """Logged although the service's log level is WARNING here (tests/conftest.py)."""
    org_id = str(uuid.uuid4())
    created = put_org(api, org_id).json()["credentials"]
    put_org(api, org_id)
    app = new_app(api, org_id, "app-1")
    key = {"api_key": PROVISIONING_KEY}
    rotated = api.post(f"/api/v1/orgs/{org_id}/apps/app-1/credentials/rotate", {"grace_period_hours": 0}, **key)
    api.post(f"/api/v1/orgs/{org_id}/credentials/revoke-tokens", {}, **key)
    expires_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    boost = api.post(
        f"/api/v1/orgs/{org_id}/quota-boosts",
        {"model_label": "premium", "amount_usd_micros": 5, "expires_at": expires_at, "app_id": "app-1"},
        **key,
    )
    tokens(api, created)  # not a provisioning action: no audit line
    lines = audit_lines(caplog)
    assert [summary(line) for line in lines] == [
        ("org.put", "succeeded", 201, None),
        ("org.put", "succeeded", 200, None),
        ("app.put", "succeeded", 201, None),
        ("app.rotate_credentials", "succeeded", 200, None),
        ("org.revoke_tokens", "succeeded", 204, None),
        ("quota_boost.create", "succeeded", 201, None),
    ]
    key_id = "key:" + hashlib.sha256(PROVISIONING_KEY.encode()).hexdigest()[:8]
    assert {(line["actor"], line["authenticated"], line["org_id"], line["source_ip"]) for line in lines} == {
        (key_id, True, org_id, "127.0.0.1")
    }
    assert [line.get("app_id") for line in lines] == [None, None, "app-1", "app-1", None, "app-1"]
    assert lines[3]["grace_period_hours"] == 0
    assert lines[5]["boost_id"] == boost.json()["boost_id"] and lines[5]["model_label"] == "premium"
    for secret in (PROVISIONING_KEY, created["client_secret"], app["client_secret"], rotated.json()["client_secret"]):
        assert secret not in json.dumps(lines)


def test_refused_provisioning_requests_are_audited(api, caplog):
    org_id, _ = new_org(api)
    audit_lines(caplog)
    key = {"api_key": PROVISIONING_KEY}
    put_org(api, org_id, api_key="a-wrong-key")
    put_org(api, org_id, {"org_name": "no other field"}, api_key=PROVISIONING_KEY)  # a bad body, the right key
    put_app(api, str(uuid.uuid4()), "app-1")
    api.post(f"/api/v1/orgs/{org_id}/apps/nope/credentials/revoke-tokens", {}, **key)
    api.post("/api/v1/orgs/not-a-uuid/credentials/rotate", {}, **key)
    lines = audit_lines(caplog)
    assert [summary(line) for line in lines] == [
        ("org.put", "refused", 401, "UNAUTHORIZED"),
        ("org.put", "refused", 400, "INVALID_REQUEST"),
        ("app.put", "refused", 404, "NOT_FOUND"),
        ("app.revoke_tokens", "refused", 404, "NOT_FOUND"),
        ("org.rotate_credentials", "refused", 400, "INVALID_REQUEST"),
    ]
    wrong = "key:" + hashlib.sha256(b"a-wrong-key").hexdigest()[:8]
    right = "key:" + hashlib.sha256(PROVISIONING_KEY.encode()).hexdigest()[:8]
    # the pipeline checks path ids before the key, so a malformed id is refused unauthenticated
    assert [(line["actor"], line["authenticated"]) for line in lines] == [
        (wrong, False),
        *[(right, True)] * 3,
        (right, False),
    ]
    assert lines[3]["app_id"] == "nope" and lines[4]["org_id"] == "not-a-uuid"


def test_a_rate_limited_provisioning_request_is_audited(limits_on, api, caplog):
    org_id, _ = new_org(api)
    path = f"/api/v1/orgs/{org_id}/credentials/rotate"
    for _ in range(5):  # the hourly rotation limit
        assert api.post(path, {"grace_period_hours": 0}, api_key=PROVISIONING_KEY).status == 200
    audit_lines(caplog)
    assert_error(api.post(path, {"grace_period_hours": 0}, api_key=PROVISIONING_KEY), 429, "RATE_LIMIT_EXCEEDED")
    (line,) = audit_lines(caplog)
    assert summary(line) == ("org.rotate_credentials", "refused", 429, "RATE_LIMIT_EXCEEDED")
    assert line["authenticated"] is True
