"""Model selection: the pure rules (no AWS), the sticky-state store (moto), and the
endpoint through the real handler."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from price_keeper import state
from price_keeper.domain import orgs, selection
from price_keeper.domain.quota import Sticky, decide, quota_pct, quota_status
from price_keeper.metric_names import STICKY_FLIPS
from price_keeper.store import daily_totals, keys, tables
from price_keeper.store.dynamo import ddb_client, table
from price_keeper.timeutil import next_midnight_utc, org_day
from tests.conftest import assert_error
from tests.factories import seed_app, token_for
from tests.usage_support import new_tenant, output_chunks, usage_body

ORDER = ("premium", "standard", "economy")
QUOTAS = {"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000}


def choose(spends, sticky=None, sticky_enabled=True, threshold=95):
    return decide(ORDER, QUOTAS, spends, threshold, sticky_enabled, sticky)


# --- the rules ------------------------------------------------------------------------


def test_first_label_under_quota_is_normal():
    decision = choose({})
    assert (decision.label, decision.reason, decision.mode, decision.newly_passed) == (
        "premium",
        "NORMAL",
        "NORMAL",
        frozenset(),
    )
    assert decision.sticky_active is False


def test_a_spent_label_falls_back_and_asks_for_sticky_state():
    decision = choose({"premium": 10_000_000})
    assert (decision.label, decision.reason, decision.newly_passed) == (
        "standard",
        "QUOTA_EXCEEDED_PREMIUM",
        {"premium"},
    )
    assert decision.sticky_active is True
    decision = choose({"premium": 12_000_000, "standard": 5_000_001})
    assert (decision.label, decision.reason, decision.newly_passed) == (
        "economy",
        "QUOTA_EXCEEDED_STANDARD",
        {"premium", "standard"},
    )


def test_sticky_state_never_goes_back_within_the_day():
    # premium would be available again (e.g. its quota was raised): stay on standard
    decision = choose({"premium": 1}, sticky=Sticky(frozenset({"premium"})))
    assert (decision.label, decision.reason, decision.newly_passed) == ("standard", "STICKY_FALLBACK", set())
    # premium still spent: the fallback reason names it, as the spec example does
    decision = choose({"premium": 10_000_000}, sticky=Sticky(frozenset({"premium"})))
    assert (decision.label, decision.reason, decision.newly_passed) == ("standard", "QUOTA_EXCEEDED_PREMIUM", set())


def test_sticky_state_moves_forward_when_its_label_is_spent():
    decision = choose({"premium": 1, "standard": 5_000_000}, sticky=Sticky(frozenset({"premium"})))
    assert (decision.label, decision.reason, decision.newly_passed) == (
        "economy",
        "QUOTA_EXCEEDED_STANDARD",
        {"standard"},
    )


def test_sticky_state_moves_an_ordering_only_past_the_labels_it_names():
    # another app of the ORG scope (ordering [standard, economy]) passed standard: premium stays
    decision = choose({"standard": 5_000_000}, sticky=Sticky(frozenset({"standard"})))
    assert (decision.label, decision.reason, decision.sticky_active) == ("premium", "NORMAL", False)
    decision = choose({"premium": 10_000_000, "standard": 1}, sticky=Sticky(frozenset({"standard"})))
    assert (decision.label, decision.reason, decision.newly_passed) == ("economy", "STICKY_FALLBACK", {"premium"})


def test_without_sticky_fallback_the_choice_follows_the_spend():
    decision = choose({"premium": 1}, sticky=Sticky(frozenset({"premium"})), sticky_enabled=False)
    assert (decision.label, decision.reason, decision.newly_passed, decision.sticky_active) == (
        "premium",
        "NORMAL",
        set(),
        False,
    )
    decision = choose({"premium": 10_000_000}, sticky_enabled=False)
    assert (decision.label, decision.newly_passed, decision.sticky_active) == ("standard", set(), False)


def test_a_sticky_label_no_longer_in_the_ordering_is_ignored():
    assert choose({}, sticky=Sticky(frozenset({"ultra_premium"}))).label == "premium"


def test_every_label_spent_chooses_nothing():
    decision = choose({"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000})
    assert (decision.index, decision.label, decision.reason) == (None, None, "ALL_QUOTAS_EXCEEDED")
    assert choose({"economy": 2_000_000}, sticky=Sticky(frozenset({"premium", "standard"}))).index is None


@pytest.mark.parametrize(
    ("spend", "threshold", "mode"),
    [
        (9_499_999, 95, "NORMAL"),
        (9_500_000, 95, "TIGHT"),
        (9_999_999, 95, "TIGHT"),
        (8_999_999, 90, "NORMAL"),
        (9_000_000, 90, "TIGHT"),
    ],
)
def test_tight_mode_starts_at_the_threshold(spend, threshold, mode):
    assert choose({"premium": spend}, threshold=threshold).mode == mode


def test_tight_mode_follows_the_label_in_use():
    decision = choose({"premium": 10_000_000, "standard": 4_750_000})
    assert (decision.label, decision.mode) == ("standard", "TIGHT")
    assert choose({"premium": 10_000_000, "standard": 100}).mode == "NORMAL"


def test_quota_percentages_and_statuses():
    assert quota_pct(9_500_000, 10_000_000) == 95.0
    assert quota_pct(10_700_000, 17_000_000) == 62.9
    assert quota_pct(2, 3) == 66.7 and quota_pct(1, 3) == 33.3 and quota_pct(1, 2000) == 0.1  # half up
    assert quota_pct(0, 0) is None
    assert [quota_status(s, 100, 95) for s in (94, 95, 99, 100, 150)] == [
        "NORMAL",
        "TIGHT",
        "TIGHT",
        "EXCEEDED",
        "EXCEEDED",
    ]


# --- the store ------------------------------------------------------------------------


def config_of(tenant):
    return orgs.effective_config(tenant.org_id, tenant.app_id)


def test_sticky_state_only_grows_and_expires_after_the_next_midnight(aws):
    tenant = new_tenant(timezone="Europe/Berlin")
    config = config_of(tenant)
    now = datetime(2026, 3, 28, 12, tzinfo=UTC)  # the day before Berlin's 23-hour day
    day = org_day(config.timezone, now)
    assert selection.write_sticky(config, day, frozenset({"premium", "standard"}), now) == Sticky(
        frozenset({"premium", "standard"})
    )
    assert selection.write_sticky(config, day, frozenset({"premium"}), now) == Sticky(
        frozenset({"premium", "standard"})
    )
    item = table(tables.STICKY_STATE).get_item(Key={"scope_key": tenant.scope, "date_key": f"DAY#{day}"})["Item"]
    assert item["passed_labels"] == {"premium", "standard"}
    assert item["expires_at_epoch"] == int(next_midnight_utc("Europe/Berlin", now).timestamp()) + 3600
    assert selection.read_sticky(tenant.scope, day) == Sticky(frozenset({"premium", "standard"}))


def test_each_sticky_flip_is_counted_once_and_a_label_already_passed_not_at_all(aws, emitted_metrics):
    config = config_of(new_tenant())
    now = datetime(2026, 3, 28, 12, tzinfo=UTC)
    day = org_day(config.timezone, now)
    selection.write_sticky(config, day, frozenset({"premium"}), now)
    selection.write_sticky(config, day, frozenset({"premium"}), now)  # another instance got there first
    selection.write_sticky(config, day, frozenset({"premium", "standard"}), now)
    assert emitted_metrics() == {STICKY_FLIPS: [1.0, 1.0]}


def put_total(scope: str, label: str, day: str, cost: int) -> None:
    table(tables.DAILY_TOTAL).put_item(
        Item={
            "usage_key": keys.usage_key(scope, label),
            "date_key": f"DAY#{day}",
            "cost_usd_micros": cost,
            "requests": 1,
            "updated_at_epoch": 1,
        }
    )


def test_a_concurrent_writers_labels_are_kept_and_adopted(aws):
    tenant = new_tenant()
    config = config_of(tenant)
    now = datetime.now(UTC)
    day = org_day(config.timezone, now)
    put_total(tenant.scope, "premium", day, 10_000_000)
    # this instance read "no sticky state" just before another one passed premium and standard
    events = ddb_client().meta.events
    raced = []

    def other_instance_wins(**_):
        if not raced:
            raced.append(True)
            selection.write_sticky(config, day, frozenset({"premium", "standard"}), now)

    events.register("after-call.dynamodb.BatchGetItem", other_instance_wins)
    try:
        snapshot = selection.current_decision(config, day, now)
    finally:
        events.unregister("after-call.dynamodb.BatchGetItem", other_instance_wins)
    assert (snapshot.decision.label, snapshot.decision.reason) == ("economy", "STICKY_FALLBACK")
    assert selection.read_sticky(tenant.scope, day) == Sticky(frozenset({"premium", "standard"}))


# --- the endpoint -----------------------------------------------------------------------


def select(api, tenant, query=""):
    return api.get(tenant.app_path + "/model-selection", token=tenant.token, query=query)


def today(tz="America/New_York") -> str:
    return org_day(tz)


def test_response_has_the_spec_shape(api):
    tenant = new_tenant(
        app_overrides={
            "model_ordering": ["premium", "standard"],
            "quotas": {"premium": 50_000_000, "standard": 20_000_000},
        }
    )
    reply = select(api, tenant)
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {
        "org_id",
        "app_id",
        "recommended_model",
        "quota_status",
        "pricing",
        "client_guidance",
        "checked_at",
        "org_day",
        "org_local_time",
    }
    assert body["recommended_model"] == {
        "label": "premium",
        "bedrock_model_id": "amazon.nova-pro-v1:0",
        "reason": "NORMAL",
        "description": "Using premium: within its daily quota",
    }
    status = body["quota_status"]
    assert status["scope"] == "APP" and status["mode"] == "NORMAL" and status["current_model"] == "premium"
    assert (status["spend_usd_micros"], status["quota_usd_micros"], status["quota_pct"]) == (0, 50_000_000, 0.0)
    assert set(status["models_status"]) == {"premium", "standard"}
    assert status["models_status"]["standard"] == {
        "spend_usd_micros": 0,
        "reserved_usd_micros": 0,
        "quota_usd_micros": 20_000_000,
        "quota_pct": 0.0,
        "status": "NORMAL",
    }
    assert body["pricing"]["source"] == "CONFIG_FALLBACK"
    assert body["pricing"]["input_price_usd_micros_per_1m"] == 800_000
    assert body["client_guidance"]["check_frequency"] == "PERIODIC_300S"
    assert body["client_guidance"]["cache_duration_secs"] == 300
    assert body["org_day"] == today() and body["checked_at"].endswith("Z")
    assert body["org_local_time"][-6:] in ("-05:00", "-04:00")
    assert reply.headers["cache-control"] == "max-age=300, private"
    assert reply.headers["etag"].startswith('"')
    assert select(api, tenant).headers["etag"] == reply.headers["etag"]


def spend(api, tenant, label: str, output_tokens: int, fold_stream):
    """Report calls of ``output_tokens`` in all (each within the per-record cap) and fold
    them into DailyTotal (the usage stream: ``fold_stream``); the last reply."""
    for chunk in output_chunks(output_tokens):
        reply = api.post(
            tenant.app_path + "/usage",
            usage_body(model_label=label, input_tokens=0, output_tokens=chunk),
            token=tenant.token,
        )
        assert reply.status == 202, reply
    fold_stream()
    return reply.json()


def test_tight_mode_shortens_the_polling_interval(api, fold_stream):
    tenant = new_tenant()
    spend(api, tenant, "premium", 3_000_000, fold_stream)  # 9.6 of 10 USD
    reply = select(api, tenant)
    body = reply.json()
    assert body["quota_status"]["mode"] == "TIGHT" and body["quota_status"]["quota_pct"] == 96.0
    assert body["client_guidance"]["check_frequency"] == "PERIODIC_60S"
    assert reply.headers["cache-control"] == "max-age=60, private"


def test_fallback_is_sticky_for_the_rest_of_the_day(api, fold_stream):
    tenant = new_tenant()
    before = select(api, tenant).headers["etag"]
    spend(api, tenant, "premium", 3_200_000, fold_stream)  # 10.24 USD: premium spent
    reply = select(api, tenant)
    body = reply.json()
    assert body["recommended_model"]["label"] == "standard"
    assert body["recommended_model"]["reason"] == "QUOTA_EXCEEDED_PREMIUM"
    assert body["recommended_model"]["description"] == "Premium quota exceeded, using standard tier"
    assert body["quota_status"]["sticky_fallback_active"] is True
    assert body["quota_status"]["models_status"]["premium"]["status"] == "EXCEEDED"
    assert reply.headers["etag"] != before
    assert selection.read_sticky(tenant.scope, today()) == Sticky(frozenset({"premium"}))
    # premium's quota is raised: the day stays on standard
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(tenant.org_id), "resource_key": "#"},
        UpdateExpression="SET quotas.premium = :q",
        ExpressionAttributeValues={":q": 10**9},
    )
    state.reset()
    body = select(api, tenant).json()
    assert (body["recommended_model"]["label"], body["recommended_model"]["reason"]) == ("standard", "STICKY_FALLBACK")


def test_sticky_disabled_writes_no_state(api, fold_stream):
    tenant = new_tenant(sticky_fallback_enabled=False)
    spend(api, tenant, "premium", 3_200_000, fold_stream)
    body = select(api, tenant).json()
    assert body["recommended_model"]["label"] == "standard"
    assert body["quota_status"]["sticky_fallback_active"] is False
    # (the fold records the alerts it fired in the same table)
    stored = table(tables.STICKY_STATE).scan()["Items"]
    assert [item for item in stored if not item["date_key"].startswith(keys.alert_prefix(today()))] == []


def test_all_labels_spent_is_429_until_the_next_org_midnight(api, fold_stream):
    tenant = new_tenant(quotas={"premium": 1_000_000, "standard": 1_000_000, "economy": 1_000_000})
    for label, tokens in (("premium", 400_000), ("standard", 400_000), ("economy", 8_000_000)):
        spend(api, tenant, label, tokens, fold_stream)
    reply = select(api, tenant)
    body = assert_error(reply, 429, "QUOTA_EXCEEDED")
    assert body["message"] == "All model quotas exceeded for today"
    midnight = next_midnight_utc("America/New_York")
    assert body["retry_after"] == midnight.strftime("%Y-%m-%dT%H:%M:%SZ")
    seconds = int(reply.headers["retry-after"])
    assert 0 < seconds <= 25 * 3600
    assert abs((datetime.now(UTC) + timedelta(seconds=seconds)) - midnight) < timedelta(seconds=5)
    details = body["details"]
    assert details["org_id"] == tenant.org_id and details["app_id"] == tenant.app_id
    assert details["models"] == {
        "premium": {"quota_pct": 128.0, "exceeded": True},
        "standard": {"quota_pct": 110.0, "exceeded": True},
        "economy": {"quota_pct": 112.0, "exceeded": True},
    }
    assert details["total_overage_usd_micros"] == 280_000 + 100_000 + 120_000


def test_org_scope_shares_the_quota_between_apps(api, fold_stream):
    tenant = new_tenant(quota_scope="ORG")
    seed_app(tenant.org_id, "app-2")
    spend(api, tenant, "premium", 3_200_000, fold_stream)
    other = api.get(f"/api/v1/orgs/{tenant.org_id}/apps/app-2/model-selection", token=token_for(tenant.org_id, "app-2"))
    assert other.json()["recommended_model"]["label"] == "standard"
    assert other.json()["quota_status"]["scope"] == "ORG"


def test_force_check_is_a_boolean(api):
    tenant = new_tenant()
    assert select(api, tenant, "force_check=true").status == 200
    assert_error(select(api, tenant, "force_check=maybe"), 400, "INVALID_REQUEST")


def test_auth_and_ids(api):
    tenant = new_tenant()
    assert_error(api.get(tenant.app_path + "/model-selection"), 401, "UNAUTHORIZED")
    assert_error(api.get(tenant.app_path + "/model-selection", token=new_tenant().token), 403, "FORBIDDEN")
    assert api.get(tenant.app_path + "/model-selection", token=tenant.org_token).status == 200
    assert_error(
        api.get("/api/v1/orgs/not-a-uuid/apps/app-1/model-selection", token=tenant.token), 400, "INVALID_REQUEST"
    )
    ghost = token_for(tenant.org_id, "ghost")
    assert_error(api.get(f"/api/v1/orgs/{tenant.org_id}/apps/ghost/model-selection", token=ghost), 404, "NOT_FOUND")


def test_tight_mode_reads_totals_plus_live_items_so_a_stale_total_cannot_overspend(api, fold_stream):
    """DailyTotal says premium is at 94 % (tight); a record counted since, not folded yet,
    is on the label-day's live items (a tight record's cost is ADDed there with its marker):
    188 %, fall back now, not one fold later. The fold moves it from the live items to the
    total."""
    tenant = new_tenant(
        quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000}, tight_mode_threshold_pct=90
    )
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    fold_stream()
    second = api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token)
    assert second.status == 202 and second.json()["daily_total"]["mode"] == "TIGHT"
    day = org_day("America/New_York")
    usage_key = keys.usage_key(tenant.scope, "premium")

    def stored() -> int:
        item = table(tables.DAILY_TOTAL).get_item(Key={"usage_key": usage_key, "date_key": keys.day_key(day)})["Item"]
        return int(item["cost_usd_micros"])

    assert stored() == 3_760  # the aggregator has not seen the second call
    assert daily_totals.live_costs([usage_key], day) == {usage_key: 3_760}

    chosen = api.get(f"{tenant.app_path}/model-selection", token=tenant.token).json()["recommended_model"]
    assert (chosen["label"], chosen["reason"]) == ("standard", "QUOTA_EXCEEDED_PREMIUM")
    fold_stream()
    assert stored() == 2 * 3_760
    assert daily_totals.live_costs([usage_key], day).get(usage_key, 0) == 0  # taken back by the fold
    chosen = api.get(f"{tenant.app_path}/model-selection", token=tenant.token).json()["recommended_model"]
    assert (chosen["label"], chosen["reason"]) == ("standard", "QUOTA_EXCEEDED_PREMIUM")  # the total alone now


# --- the selection a usage answer carries (?model_selection=true) ------------------------

VOLATILE = ("checked_at", "org_local_time")


def report(api, tenant, query="model_selection=true", path="/usage", body=None, **fields):
    return api.post(tenant.app_path + path, body or usage_body(**fields), token=tenant.token, query=query)


def without_volatile(selection: dict) -> dict:
    return {key: value for key, value in selection.items() if key not in VOLATILE}


def test_a_usage_answer_asked_for_it_carries_the_selection_the_endpoint_answers(api):
    tenant = new_tenant()
    plain = report(api, tenant, query="")
    assert plain.status == 202 and "model_selection" not in plain.json()
    asked = report(api, tenant)
    assert asked.status == 202, asked
    carried = asked.json()["model_selection"]
    assert carried["recommended_model"]["label"] == "premium"
    assert without_volatile(carried) == without_volatile(select(api, tenant).json())
    # a duplicate report is answered with the selection too, and counted once
    again = report(api, tenant, request_id=asked.json()["request_id"])
    assert again.json()["duplicate"] is True and again.json()["model_selection"] == carried | {
        key: again.json()["model_selection"][key] for key in VOLATILE
    }


def test_a_usage_answer_carries_the_fallback_and_moves_sticky_state_as_the_endpoint_would(api, fold_stream):
    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    spend(api, tenant, "premium", 2_000, fold_stream)  # 7,500 µUSD at $3/$15: premium is spent
    carried = report(api, tenant, model_label="standard").json()["model_selection"]
    assert (carried["recommended_model"]["label"], carried["recommended_model"]["reason"]) == (
        "standard",
        "QUOTA_EXCEEDED_PREMIUM",
    )
    assert carried["quota_status"]["sticky_fallback_active"] is True
    assert selection.read_sticky(tenant.scope, today()) == Sticky(frozenset({"premium"}))


def test_a_usage_answer_when_every_label_is_spent_carries_no_selection(api, fold_stream):
    tenant = new_tenant(quotas={"premium": 1_000, "standard": 1_000, "economy": 1_000})
    for label in ORDER:
        spend(api, tenant, label, 2_000, fold_stream)
    reply = report(api, tenant, model_label="economy")
    assert reply.status == 202 and reply.json()["model_selection"] is None
    assert_error(select(api, tenant), 429, "QUOTA_EXCEEDED")


def test_a_usage_batch_answer_asked_for_it_carries_the_selection(api):
    tenant = new_tenant()
    batch = {"requests": [usage_body(), usage_body(model_label="standard")]}
    plain = report(api, tenant, query="", path="/usage/batch", body=batch)
    assert plain.status == 207 and "model_selection" not in plain.json()
    asked = report(api, tenant, path="/usage/batch", body={"requests": [usage_body()]})
    assert asked.status == 207 and asked.json()["accepted"] == 1
    assert without_volatile(asked.json()["model_selection"]) == without_volatile(select(api, tenant).json())


@pytest.mark.parametrize("path", ["/usage", "/usage/batch"])
def test_model_selection_of_a_report_is_a_boolean_and_a_bad_one_writes_nothing(api, path):
    from tests.usage_support import dedup_items

    tenant = new_tenant()
    body = {"requests": [usage_body()]} if path == "/usage/batch" else usage_body()
    assert_error(report(api, tenant, query="model_selection=maybe", path=path, body=body), 400, "INVALID_REQUEST")
    assert dedup_items() == []
