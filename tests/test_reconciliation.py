"""Reconciliation on moto: Bedrock's CloudWatch counts (``AWS/Bedrock`` datapoints put as the
local stand-in puts them, at the time of each call) against usage metered through the real
metering and aggregator, with explicit clocks. The HTTP path is tests/test_reconciliation_e2e.py."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from price_keeper import state
from price_keeper.aws import events as alert_events
from price_keeper.config import get_config
from price_keeper.domain import alerts, reconciliation
from price_keeper.errors import ApiError
from price_keeper.store import alert_records, dynamo, keys, tables
from price_keeper.store import reconciliation as reconciliation_store
from tests.factories import seed_app, seed_org
from tests.usage_support import daily_total, iso, submit_and_fold

DAY = date(2026, 11, 20)
NOON = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
NOVA_PRO, NOVA_MICRO = "amazon.nova-pro-v1:0", "amazon.nova-micro-v1:0"
TOLERANCE = timedelta(seconds=get_config().reconciliation.tolerance_seconds)


@pytest.fixture
def tenant(aws):
    org_id = seed_org(timezone="UTC", model_ordering=("premium", "standard", "economy"))
    seed_app(org_id, "app-1")
    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    return org_id


def bedrock_call(model: str, at: datetime, input_tokens: int, output_tokens: int) -> None:
    """What Bedrock publishes for one call (``local.bedrock.Runtime.record_metrics``'s shape)."""
    values = {"Invocations": 1, "InputTokenCount": input_tokens, "OutputTokenCount": output_tokens}
    boto3.client("cloudwatch").put_metric_data(
        Namespace="AWS/Bedrock",
        MetricData=[
            {"MetricName": name, "Dimensions": [{"Name": "ModelId", "Value": model}], "Value": v, "Timestamp": at}
            for name, v in values.items()
        ],
    )


def report(org_id: str, label: str, model: str, call: datetime, arrives: datetime, inp: int, out: int) -> None:
    """A usage record of a call at ``call`` that reaches the service at ``arrives`` and is
    folded by the aggregator a second later."""
    fields = {"model_label": label, "bedrock_model_id": model, "input_tokens": inp, "output_tokens": out}
    submit_and_fold(org_id, "app-1", arrives, timestamp=iso(call), **fields)


def row(result: dict, model: str) -> dict:
    return next(found for found in result["models"] if found["model_id"] == model)


def test_calls_never_reported_are_unmetered_and_raise_an_operator_alert(tenant):
    for minute in (1, 2, 3):
        bedrock_call(NOVA_PRO, NOON + timedelta(minutes=minute), 1000, 200)
    report(tenant, "premium", NOVA_PRO, NOON + timedelta(minutes=1), NOON + timedelta(minutes=1, seconds=5), 1000, 200)
    result = reconciliation.reconcile(DAY, NOON + timedelta(minutes=4) + TOLERANCE)
    premium = row(result, NOVA_PRO)
    assert premium["bedrock"] == {"invocations": 3, "input_tokens": 3000, "output_tokens": 600}
    assert premium["metered"] == {"invocations": 1, "input_tokens": 1000, "output_tokens": 200}
    # 2000 x 0.80 + 400 x 3.20 USD per 1M tokens (config.yaml premium)
    assert premium["unmetered"] == {"input_tokens": 2000, "output_tokens": 400, "estimated_cost_usd_micros": 2880}
    assert (result["date"], result["region"]) == ("2026-11-20", "us-east-1")
    (alert,) = alert_records.of_day(alerts.OPERATOR_SCOPE, "20261120").values()
    assert (alert["type"], alert["model_id"], int(alert["spend_usd_micros"]), alert["published"]) == (
        "UNREPORTED_USAGE",
        NOVA_PRO,
        2880,
        True,
    )
    assert reconciliation.stored("2026-11-20") == {
        **{k: result[k] for k in ("date", "region", "models")},
        "page": 0,
        "pages": 1,
    }


def test_an_app_that_reports_everything_shows_nothing_unmetered(tenant):
    for minute in (1, 2):
        call = NOON + timedelta(minutes=minute)
        bedrock_call(NOVA_MICRO, call, 500, 50)
        report(tenant, "economy", NOVA_MICRO, call, call + timedelta(seconds=2), 500, 50)
    result = reconciliation.reconcile(DAY, NOON + timedelta(minutes=3) + TOLERANCE)
    assert row(result, NOVA_MICRO)["unmetered"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "estimated_cost_usd_micros": 0,
    }
    assert alert_records.of_day(alerts.OPERATOR_SCOPE, "20261120") == {}


def test_a_report_late_within_the_tolerance_is_no_false_alarm_at_any_run(tenant):
    """Calls at 12:58 reported just under the tolerance later (in the next hour, even the
    next day for a call at 23:59): every run before, at and after the report sees 0."""
    late = TOLERANCE - timedelta(seconds=30)
    for call in (NOON + timedelta(minutes=58), datetime(2026, 11, 20, 23, 59, tzinfo=UTC)):
        bedrock_call(NOVA_PRO, call, 1000, 100)
        runs_before = [call + timedelta(seconds=10), call + late - timedelta(seconds=1)]
        for moment in runs_before:
            assert row(reconciliation.reconcile(DAY, moment), NOVA_PRO)["unmetered"]["input_tokens"] == 0
        report(tenant, "premium", NOVA_PRO, call, call + late, 1000, 100)
        for moment in (call + late + timedelta(seconds=2), call + TOLERANCE + timedelta(hours=3)):
            assert row(reconciliation.reconcile(DAY, moment), NOVA_PRO)["unmetered"]["input_tokens"] == 0
    assert alert_records.of_day(alerts.OPERATOR_SCOPE, "20261120") == {}


def test_a_report_later_than_the_tolerance_shows_as_unmetered(tenant):
    call = NOON + timedelta(minutes=5)
    bedrock_call(NOVA_PRO, call, 1000, 100)
    result = reconciliation.reconcile(DAY, call + TOLERANCE + timedelta(seconds=1))
    assert row(result, NOVA_PRO)["unmetered"]["input_tokens"] == 1000


def test_usage_of_other_days_is_not_counted_for_this_one(tenant):
    """Metered arrivals of the day before (and after the day's tolerance) do not cover this
    day's unreported calls."""
    before = datetime(2026, 11, 19, 22, 0, tzinfo=UTC)
    report(tenant, "premium", NOVA_PRO, before, before, 5000, 500)
    after = datetime(2026, 11, 21, 3, 0, tzinfo=UTC)
    report(tenant, "premium", NOVA_PRO, after, after, 5000, 500)
    bedrock_call(NOVA_PRO, NOON, 1000, 100)
    result = reconciliation.reconcile(DAY, datetime(2026, 11, 21, 6, 0, tzinfo=UTC))
    assert row(result, NOVA_PRO)["metered"]["invocations"] == 0
    assert row(result, NOVA_PRO)["unmetered"]["input_tokens"] == 1000


def test_the_aggregator_marks_a_label_total_per_hour_without_another_write(tenant):
    scope = keys.scope_key(tenant, "app-1", "APP")
    report(tenant, "premium", NOVA_PRO, NOON, NOON, 10, 1)
    report(tenant, "premium", NOVA_PRO, NOON + timedelta(hours=1), NOON + timedelta(hours=1), 20, 2)
    total = daily_total(scope, "premium", "20261120")
    assert reconciliation_store.marks_of(total) == [
        ("2026112012", [1, 10, 1, 0, 0]),
        ("2026112013", [2, 30, 3, 0, 0]),
    ]
    counts = reconciliation.arrived_between(total, NOON + timedelta(hours=1), None)
    assert (counts.requests, counts.input_tokens) == (1, 20)


@pytest.mark.slow  # volume: 50 reports folded over a day of 25 hours
def test_a_label_total_folded_in_every_hour_of_its_day_stays_under_one_write_unit(aws):
    """The 25 hour marks of a label folded in every hour of a day of 25 (New York's 1 November
    2026, when clocks go back), of the longest app id: packed, the label total stays under
    1 KB, so each fold writes it for 1 unit (2 in its transaction), where a mark an attribute
    passed 1 KB after ~17 hours and doubled that."""
    org_id, app_id = seed_org(timezone="America/New_York"), "a" * 64
    seed_app(org_id, app_id)
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    fields = {"model_label": "premium", "bedrock_model_id": NOVA_PRO, "input_tokens": 90_000, "output_tokens": 9_000}
    for hour in range(25):
        at = start + timedelta(hours=hour)
        for _ in range(2):
            submit_and_fold(org_id, app_id, at, timestamp=iso(at), **fields)
    total = daily_total(keys.scope_key(org_id, app_id, "APP"), "premium", "20261101")
    marks = reconciliation_store.marks_of(total)
    assert len(marks) == 25 and marks[-1] == ("2026110204", [50, 50 * 90_000, 50 * 9_000, 0, 0])
    assert dynamo.item_size(total) < 1024
    legacy = {**total, **{f"H{hour}": values for hour, values in marks}}
    del legacy[keys.HOUR_MARKS]
    assert dynamo.item_size(legacy) > 1024  # what one attribute a mark would weigh


def test_marks_pack_and_unpack_exactly():
    marks = {0: [0, 0, 0, 0, 0], 494_000: [1, 127, 128, 2**40, 3], 494_001: [2, 10**12, 1, 0, 0]}
    assert reconciliation_store.unpack_marks(reconciliation_store.pack_marks(marks)) == marks
    assert reconciliation_store.unpack_marks(None) == {}


@given(
    st.dictionaries(
        st.integers(-(2**40), 2**40),
        st.lists(st.integers(-(2**70), 2**70), min_size=5, max_size=5),
        max_size=30,
    )
)
def test_marks_of_any_sign_pack_and_unpack_exactly(marks):
    """A negative sum (the outside review's hang: ``-1`` made the encoder loop for ever)
    packs and comes back as it was, as every other number does."""
    assert reconciliation_store.unpack_marks(reconciliation_store.pack_marks(marks)) == marks


def test_the_metered_side_reads_no_config_for_config_labels_and_the_totals_in_pages(aws, monkeypatch):
    """A fleet's day has ~100,000 scopes and ~1 M label totals: the reconciler resolves
    config.yaml labels without reading any org's config (a read a scope could not finish),
    and reads the totals a few at a time (bounded memory); every arrival is counted."""
    scopes = [seed_org(timezone="UTC") for _ in range(6)]
    for org_id in scopes:
        seed_app(org_id, "app-1")
        for label, model in (("premium", NOVA_PRO), ("economy", NOVA_MICRO)):
            report(org_id, label, model, NOON, NOON, 100, 10)
    monkeypatch.setattr(reconciliation_store, "TOTALS_AT_ONCE", 2)
    state.reset()  # a cold reconciler: no config cached
    reads: list[tuple[str, str, int]] = []

    def count(params, model, **_):
        body = json.loads(params["body"])
        if model.name == "BatchGetItem":
            reads.extend((model.name, name, len(wanted["Keys"])) for name, wanted in body["RequestItems"].items())
        elif model.name in ("GetItem", "Query"):
            reads.append((model.name, body["TableName"], 1))

    dynamo.ddb_client().meta.events.register("before-call.dynamodb", count)
    counts, _ = reconciliation.metered_counts(DAY, NOON - timedelta(hours=1), None)
    assert (counts[NOVA_PRO].requests, counts[NOVA_MICRO].requests) == (6, 6)
    assert counts[NOVA_PRO].input_tokens == 600
    assert not [read for read in reads if read[1] == tables.CONFIG.physical_name]
    totals = [keys_read for _, name, keys_read in reads if name == tables.DAILY_TOTAL.physical_name]
    assert sum(totals) == 12 and max(totals) <= 2


def test_profile_arns_and_their_ids_are_one_model():
    assert reconciliation.model_key("arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0") == NOVA_PRO
    assert (
        reconciliation.model_key("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.x.y-v1:0")
        == "us.x.y-v1:0"
    )
    assert reconciliation.model_key(NOVA_PRO) == NOVA_PRO


@pytest.mark.slow  # volume: make test
def test_a_fleets_models_of_a_day_are_kept_and_answered_in_pages(aws):
    """A day of 1,200 application profiles (~400 KB of model rows, past one item, and past
    what one answer may carry at ~20,000) is kept in pages and answered a page at a time,
    as ``GET /api/v1/reconciliation?page=`` answers it."""
    from price_keeper.store import reconciliation as store
    from price_keeper.store.dynamo import item_size, table
    from price_keeper.store.tables import DAILY_TOTAL

    side = {"invocations": 10, "input_tokens": 10_000, "output_tokens": 2_000}
    models = [
        {
            "model_id": f"arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/{n:012d}",
            "bedrock": side,
            "metered": side,
            "unmetered": {"input_tokens": 0, "output_tokens": 0, "estimated_cost_usd_micros": 0},
        }
        for n in range(1_200)
    ]
    store.put_result("20261120", {"date": "2026-11-20", "region": "us-east-1", "models": models}, 2_000_000_000)
    answers = [reconciliation.stored("2026-11-20", page) for page in range(3)]
    assert [(answer["page"], answer["pages"]) for answer in answers] == [(0, 3), (1, 3), (2, 3)]
    assert [model for answer in answers for model in answer["models"]] == models
    with pytest.raises(ApiError) as past:
        reconciliation.stored("2026-11-20", 3)
    assert (past.value.status, past.value.details) == (400, {"page": 3, "pages": 3})
    pages = [
        table(DAILY_TOTAL).get_item(Key=keys.page_key(keys.reconciliation_key("20261120"), n))["Item"] for n in range(3)
    ]
    assert [len(page["models"]) for page in pages] == [500, 500, 200] and max(map(item_size, pages)) < 400_000


def test_an_application_profiles_unmetered_spend_is_its_owners_app_or_org_else_the_operators():
    """Red-team note: two apps of one org registering a profile sent the org's alert to the
    operator (owners were compared by app)."""
    assert reconciliation.common_owner({("o", "a")}) == ("o", "a")
    assert reconciliation.common_owner({("o", "a"), ("o", "b")}) == ("o", None)
    assert reconciliation.common_owner({("o", "a"), ("p", "a")}) is None
    assert reconciliation.common_owner({("o", "a"), None}) is None
