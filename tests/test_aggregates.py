"""GET .../aggregates/today and .../aggregates/{date} for orgs and apps, through the real
handler on moto."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from price_keeper.bodies import UsageRequest
from price_keeper.domain import aggregates, metering
from price_keeper.store import keys, tables
from price_keeper.timeutil import day_start_utc, org_date, org_day
from tests.conftest import assert_error, keys_asked, profile_reads
from tests.factories import seed_app, seed_org, seed_profiles, token_for
from tests.usage_support import PREMIUM_DOLLAR, iso, new_tenant, put_records, usage_body

NY = "America/New_York"


def report(api, tenant, label="premium", **fields):
    reply = api.post(tenant.app_path + "/usage", usage_body(model_label=label, **fields), token=tenant.token)
    assert reply.status == 202, reply


def test_app_today_has_the_spec_shape(api, fold_stream):
    tenant = new_tenant(app_overrides={"app_name": "Production API"})
    for _ in range(8):
        report(api, tenant, input_tokens=1_000_000, output_tokens=125_000)  # 0.80 + 0.40 USD
    report(api, tenant, "standard", input_tokens=100, output_tokens=100, cache_read_input_tokens=1000)
    fold_stream()
    reply = api.get(tenant.app_path + "/aggregates/today", token=tenant.token)
    assert reply.status == 200, reply
    body = reply.json()
    assert body["org_id"] == tenant.org_id and body["app_id"] == tenant.app_id
    assert body["app_name"] == "Production API"
    assert body["date"] == org_date(NY).isoformat() and body["timezone"] == NY and body["quota_scope"] == "APP"
    assert list(body["models"]) == ["premium", "standard", "economy"]
    premium = body["models"]["premium"]
    assert premium == {
        "label": "premium",
        "bedrock_model_id": "amazon.nova-pro-v1:0",
        "cost_usd_micros": 9_600_000,
        "reserved_usd_micros": 0,
        "quota_usd_micros": 10_000_000,
        "quota_pct": 96.0,
        "quota_status": "TIGHT",
        "input_tokens": 8_000_000,
        "output_tokens": 1_000_000,
        "cache_read_input_tokens": 0,
        "cache_write_input_tokens": 0,
        "requests": 8,
        "average_cost_per_request": 1_200_000,
    }
    assert body["models"]["standard"]["cache_read_input_tokens"] == 1000
    assert body["models"]["economy"]["average_cost_per_request"] == 0
    standard_cost = body["models"]["standard"]["cost_usd_micros"]
    assert body["total_cost_usd_micros"] == 9_600_000 + standard_cost
    assert body["total_quota_usd_micros"] == 17_000_000
    assert body["total_quota_pct"] == round((9_600_000 + standard_cost) * 100 / 17_000_000, 1)
    assert body["sticky_fallback_active"] is False and body["current_active_model"] == "premium"
    assert body["updated_at"].endswith("Z")
    assert reply.headers["cache-control"] == "max-age=30, private"
    assert reply.headers["etag"].startswith('"')
    assert 0 <= int(reply.headers["x-data-lag-secs"]) < 60


def test_sticky_fallback_shows_in_aggregates(api, fold_stream):
    tenant = new_tenant()
    for _ in range(10):
        report(api, tenant, **PREMIUM_DOLLAR)
    fold_stream()
    api.get(tenant.app_path + "/model-selection", token=tenant.token)  # flips to standard
    body = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).json()
    assert body["models"]["premium"]["quota_status"] == "EXCEEDED"
    assert (body["sticky_fallback_active"], body["current_active_model"]) == (True, "standard")


def test_org_aggregates_of_an_app_scoped_org_sum_its_apps(api, fold_stream):
    tenant = new_tenant()
    seed_app(tenant.org_id, "app-2", model_ordering=["economy"], quotas={"economy": 1_000_000})
    report(api, tenant, output_tokens=100_000, input_tokens=0)  # 0.32 USD
    api.post(
        f"{tenant.org_path}/apps/app-2/usage",
        usage_body(model_label="economy"),
        token=token_for(tenant.org_id, "app-2"),
    )
    outside = api.post(
        f"{tenant.org_path}/apps/app-2/usage",
        usage_body(output_tokens=100_000, input_tokens=0),
        token=token_for(tenant.org_id, "app-2"),
    )
    assert outside.status == 202, outside  # premium is not in app-2's ordering: counted all the same
    fold_stream()
    reply = api.get(tenant.org_path + "/aggregates/today", token=tenant.org_token)
    assert reply.status == 200, reply
    body = reply.json()
    assert "app_id" not in body and body["quota_scope"] == "APP"
    assert body["models"]["premium"]["cost_usd_micros"] == 2 * 320_000
    assert body["models"]["economy"]["requests"] == 1
    assert body["sticky_fallback_active"] is False


def test_org_aggregates_of_an_org_scoped_org_match_its_apps(api, fold_stream):
    tenant = new_tenant(quota_scope="ORG")
    report(api, tenant)
    fold_stream()
    org = api.get(tenant.org_path + "/aggregates/today", token=tenant.org_token).json()
    app = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).json()
    assert org["models"] == app["models"] and org["models"]["premium"]["requests"] == 1


def test_a_past_day_with_data(api, fold_stream):
    tenant = new_tenant()
    today = org_date(NY)
    yesterday = today - timedelta(days=1)
    noon = day_start_utc(NY, yesterday) + timedelta(hours=12)
    metering.submit(
        tenant.org_id,
        tenant.app_id,
        UsageRequest.model_validate(usage_body(timestamp=iso(noon))),
        now=noon + timedelta(seconds=5),
    )  # reported yesterday
    fold_stream()
    reply = api.get(f"{tenant.app_path}/aggregates/{yesterday.isoformat()}", token=tenant.token)
    assert reply.status == 200, reply
    assert reply.json()["date"] == yesterday.isoformat()
    assert reply.json()["models"]["premium"]["requests"] == 1
    org = api.get(f"{tenant.org_path}/aggregates/{yesterday.isoformat()}", token=tenant.org_token)
    assert org.status == 200 and org.json()["models"]["premium"]["cost_usd_micros"] == 3760
    # the date path for today answers like /today, data or not
    assert api.get(f"{tenant.app_path}/aggregates/{today.isoformat()}", token=tenant.token).status == 200


def test_a_past_day_without_data_is_404(api):
    tenant = new_tenant()
    body = assert_error(api.get(f"{tenant.app_path}/aggregates/2025-12-15", token=tenant.token), 404, "NOT_FOUND")
    assert body["message"] == "No data available for specified date"
    assert body["details"]["date"] == "2025-12-15"


@pytest.mark.parametrize("text", ["2026-13-45", "2026-02-30", "20260123", "2026-1-3", "today2", "2026-01-23T00:00"])
def test_invalid_dates_are_400(api, text):
    tenant = new_tenant()
    body = assert_error(api.get(f"{tenant.app_path}/aggregates/{text}", token=tenant.token), 400, "INVALID_REQUEST")
    assert body["details"] == {"date": text, "expected_format": "YYYY-MM-DD"}


def test_future_dates_are_400(api):
    tenant = new_tenant()
    tomorrow = (org_date(NY) + timedelta(days=1)).isoformat()
    assert_error(api.get(f"{tenant.org_path}/aggregates/{tomorrow}", token=tenant.org_token), 400, "INVALID_REQUEST")


def test_access_rules(api):
    tenant = new_tenant()
    assert_error(api.get(tenant.org_path + "/aggregates/today", token=tenant.token), 403, "FORBIDDEN")
    assert_error(api.get(tenant.org_path + "/aggregates/today"), 401, "UNAUTHORIZED")
    assert api.get(tenant.app_path + "/aggregates/today", token=tenant.org_token).status == 200
    assert_error(api.get(tenant.app_path + "/aggregates/today", token=new_tenant().token), 403, "FORBIDDEN")
    assert_error(api.get("/api/v1/orgs/not-a-uuid/aggregates/today", token=tenant.org_token), 400, "INVALID_REQUEST")
    ghost_app = token_for(tenant.org_id, "ghost")
    assert_error(api.get(f"{tenant.org_path}/apps/ghost/aggregates/today", token=ghost_app), 404, "NOT_FOUND")
    ghost_org = str(uuid.uuid4())
    assert_error(api.get(f"/api/v1/orgs/{ghost_org}/aggregates/today", token=token_for(ghost_org)), 404, "NOT_FOUND")


def test_lag_header_is_absent_until_the_aggregator_has_run(api):
    tenant = new_tenant()
    reply = api.get(tenant.app_path + "/aggregates/today", token=tenant.token)
    assert reply.status == 200 and "x-data-lag-secs" not in reply.headers
    assert reply.json()["updated_at"] is None


def test_etag_changes_with_the_data(api, fold_stream):
    tenant = new_tenant()
    before = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).headers["etag"]
    report(api, tenant)
    fold_stream()
    after = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).headers["etag"]
    assert before != after
    assert api.get(tenant.app_path + "/aggregates/today", token=tenant.token).headers["etag"] == after


# --- labels outside the orderings (profiles) ---------------------------------------------

PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"


def usage_keys_read(calls) -> list[str]:
    """The DailyTotal ``usage_key`` of every item ``calls`` (``dynamodb_calls``) read."""
    return [key["usage_key"] for op, params in calls for key in keys_asked(op, params, tables.DAILY_TOTAL)]


def spend_on(org_id: str, spent: dict[str, list[str]], fold_stream) -> None:
    """Each app of ``spent`` spends 100 micro-USD on each of its labels today, folded."""
    day = org_day(NY)
    for app_id, labels in spent.items():
        for label in labels:
            put_records(keys.scope_key(org_id, app_id, "APP"), label, day=day)
    fold_stream()


def test_org_aggregates_read_each_profile_label_only_for_the_apps_that_spent_on_it(api, dynamodb_calls, fold_stream):
    """Red-team HIGH: every label outside the orderings was read for every app (12 apps x 60
    profiles: 8,716 keys and 4,358 RRU for one answer); each app lists the labels it spent
    on, and only those (app, label) keys are read."""
    org_id = seed_org(quota_scope="APP")
    spent = {app_id: [f"{app_id}-profile-{n}" for n in range(2)] for app_id in ("app-1", "app-2", "app-3")}
    for app_id in spent:
        seed_app(org_id, app_id)
    spend_on(org_id, spent, fold_stream)
    dynamodb_calls.clear()
    reply = api.get(f"/api/v1/orgs/{org_id}/aggregates/today", token=token_for(org_id))
    assert reply.status == 200, reply
    profile_keys = {key for key in usage_keys_read(dynamodb_calls) if "-profile-" in key}
    listed = {
        keys.usage_key(keys.scope_key(org_id, app, "APP"), label) for app, labels in spent.items() for label in labels
    }
    assert profile_keys == listed  # 6 keys, not 3 apps x 6 labels
    body = reply.json()
    assert {label: body["models"][label]["cost_usd_micros"] for labels in spent.values() for label in labels} == {
        label: 100 for labels in spent.values() for label in labels
    }
    assert (body["total_cost_usd_micros"], body["models_omitted"]) == (600, 0)


def test_labels_outside_the_orderings_are_shown_up_to_a_bound_and_the_rest_counted(
    api, dynamodb_calls, monkeypatch, fold_stream
):
    """An org of apps x 400 profiles would read and answer without a bound (past Lambda's
    6 MB): whole labels in label order while their keys fit ``MAX_KEYS_OUTSIDE_ORDERINGS``,
    the others counted in ``models_omitted`` and their spend in the total."""
    org_id = seed_org(quota_scope="APP")
    for app_id in ("app-1", "app-2"):
        seed_app(org_id, app_id)
    spend_on(org_id, {"app-1": ["p-a", "p-b"], "app-2": ["p-b", "p-c"]}, fold_stream)
    monkeypatch.setattr(aggregates, "MAX_KEYS_OUTSIDE_ORDERINGS", 3)  # p-a (1 key), p-b (2): p-c does not fit
    dynamodb_calls.clear()
    body = api.get(f"/api/v1/orgs/{org_id}/aggregates/today", token=token_for(org_id)).json()
    assert {label for label in body["models"] if label.startswith("p-")} == {"p-a", "p-b"}
    assert body["models"]["p-b"]["cost_usd_micros"] == 200
    assert (body["models_omitted"], body["total_cost_usd_micros"]) == (1, 400)
    assert not [key for key in usage_keys_read(dynamodb_calls) if key.endswith("#p-c")]
    app_2 = api.get(f"/api/v1/orgs/{org_id}/apps/app-2/aggregates/today", token=token_for(org_id, "app-2")).json()
    assert ({"p-b", "p-c"} <= set(app_2["models"]), app_2["models_omitted"]) == (True, 0)


@pytest.mark.slow  # volume: hundreds of calls; make test and CI run it
def test_app_aggregates_resolve_their_profile_labels_together_and_cache_them(api, dynamodb_calls, fold_stream):
    """Red-team HIGH: one GetItem per profile label (400 profiles: 407 calls cold); the
    labels' Bedrock ids come from one BatchGetItem per 100 profiles, misses included in the
    cache, so the next answer reads none."""
    org_id = seed_org(quota_scope="APP")
    seed_app(org_id, "app-1")
    registered = [f"profile-{n:03d}" for n in range(150)]
    seed_profiles(org_id, "app-1", registered, PROFILE_ARN)
    spend_on(org_id, {"app-1": [*registered, "never-registered"]}, fold_stream)
    path, token = f"/api/v1/orgs/{org_id}/apps/app-1/aggregates/today", token_for(org_id, "app-1")
    for answer in ("cold", "warm"):
        dynamodb_calls.clear()
        models = api.get(path, token=token).json()["models"]
        assert {label: models[label]["bedrock_model_id"] for label in [*registered, "never-registered"]} == {
            **dict.fromkeys(registered, PROFILE_ARN),
            "never-registered": None,
        }
        assert profile_reads(dynamodb_calls) == (["BatchGetItem"] * 2 if answer == "cold" else []), answer  # 151 keys
