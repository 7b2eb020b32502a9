"""Spend alerts: detection rules, once per org-local day (also under concurrent runs),
EventBridge delivery and its retry, and GET /api/v1/orgs/{org_id}/alerts."""

import json
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from price_keeper.aws import client
from price_keeper.aws import events as alert_events
from price_keeper.domain import alerts, orgs
from price_keeper.domain.aggregation import RunReport
from price_keeper.domain.alerts import ALL_EXHAUSTED, FALLBACK, THRESHOLD, Alert, due_alerts
from price_keeper.metric_names import AGGREGATOR_LAG_SECONDS, SPEND_PCT
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_day
from tests.conftest import assert_error
from tests.factories import seed_app, seed_org, token_for
from tests.provisioned import new_org, org_body, put_app, put_org

ORDERING = ("premium", "standard", "economy")
QUOTAS = {"premium": 1000, "standard": 500, "economy": 200}
NOW = datetime(2026, 10, 1, 15, 0, tzinfo=UTC)
DAY = "20261001"


# --- detection (pure) ------------------------------------------------------------------


def kinds(due):
    return [(a.type, a.label, a.threshold_pct) for a in due]


def test_nothing_is_due_below_the_lowest_threshold():
    assert due_alerts(ORDERING, QUOTAS, {"premium": 799, "standard": 399}, (), (80, 95)) == []


def test_thresholds_fire_at_their_percentage_of_each_quota():
    due = due_alerts(ORDERING, QUOTAS, {"premium": 800, "standard": 475}, (), (80, 95))
    assert kinds(due) == [(THRESHOLD, "premium", 80), (THRESHOLD, "standard", 80), (THRESHOLD, "standard", 95)]
    assert (due[0].spend_usd_micros, due[0].quota_usd_micros) == (800, 1000)


def test_first_label_spent_is_a_fallback_to_the_next():
    due = due_alerts(ORDERING, QUOTAS, {"premium": 1000}, (), (80, 95))
    assert kinds(due) == [(THRESHOLD, "premium", 80), (THRESHOLD, "premium", 95), (FALLBACK, "premium", None)]
    assert due[-1].fallback_to == "standard"


def test_sticky_state_past_a_label_is_a_fallback_even_when_totals_lag():
    due = due_alerts(ORDERING, QUOTAS, {}, {"premium", "standard"}, (80, 95))
    assert kinds(due) == [(FALLBACK, "premium", None), (FALLBACK, "standard", None)]


def test_every_label_spent_is_all_exhausted():
    due = due_alerts(ORDERING, QUOTAS, {"premium": 1000, "standard": 600, "economy": 200}, (), (95,))
    assert kinds(due) == [
        (THRESHOLD, "premium", 95),
        (THRESHOLD, "standard", 95),
        (THRESHOLD, "economy", 95),
        (FALLBACK, "premium", None),
        (FALLBACK, "standard", None),
        (ALL_EXHAUSTED, None, None),
    ]


def test_a_single_spent_label_has_nowhere_to_fall_back_to():
    assert kinds(due_alerts(("premium",), {"premium": 10}, {"premium": 10}, (), ())) == [(ALL_EXHAUSTED, None, None)]


def test_a_label_without_quota_counts_as_spent_but_has_no_threshold():
    due = due_alerts(("premium", "standard"), {"standard": 100}, {}, (), (80,))
    assert kinds(due) == [(FALLBACK, "premium", None)]


def test_alert_keys_name_day_type_label_and_threshold():
    assert Alert(THRESHOLD, "premium", 80).date_key(DAY) == "ALERT#20261001#THRESHOLD#premium#80"
    assert Alert(FALLBACK, "premium").date_key(DAY) == "ALERT#20261001#FALLBACK#premium#-"
    assert Alert(ALL_EXHAUSTED).date_key(DAY) == "ALERT#20261001#ALL_EXHAUSTED#-#-"


# --- firing --------------------------------------------------------------------------------


@pytest.fixture
def bus(aws):
    """The service bus in moto with a rule delivering its events to a queue; returns a
    function draining the delivered events."""
    events, sqs = boto3.client("events"), boto3.client("sqs")
    events.create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    queue = sqs.create_queue(QueueName=f"alerts-{uuid.uuid4().hex}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(
        Name="to-queue",
        EventBusName=alert_events.DEFAULT_EVENT_BUS,
        EventPattern=json.dumps({"source": [alert_events.EVENT_SOURCE]}),
    )
    events.put_targets(Rule="to-queue", EventBusName=alert_events.DEFAULT_EVENT_BUS, Targets=[{"Id": "q", "Arn": arn}])

    def delivered() -> list[dict]:
        found = []
        while True:
            batch = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
            if not batch:
                return found
            for message in batch:
                found.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

    return delivered


@pytest.fixture
def put_events_calls(aws):
    calls = Counter()

    def count(**_):
        calls["PutEvents"] += 1

    client("events").meta.events.register("before-call.events.PutEvents", count)
    return calls


@pytest.fixture
def org_config(aws):
    org_id = seed_org(quota_scope="ORG", model_ordering=ORDERING, quotas=QUOTAS)
    return orgs.effective_config(org_id)


def fire(config, spends, sticky=(), day=DAY, now=NOW):
    return alerts.evaluate_and_fire(config, day, spends, sticky, now)


def records(scope: str) -> list[dict]:
    return table(tables.STICKY_STATE).query(
        KeyConditionExpression="scope_key = :s AND begins_with(date_key, :p)",
        ExpressionAttributeValues={":s": scope, ":p": "ALERT#"},
        ConsistentRead=True,
    )["Items"]


def test_a_crossing_fires_once_and_the_next_threshold_fires_later(bus, put_events_calls, org_config):
    assert fire(org_config, {"premium": 799}) == [] and records(org_config.scope) == []
    assert kinds(fire(org_config, {"premium": 850})) == [(THRESHOLD, "premium", 80)]
    assert fire(org_config, {"premium": 900}) == []
    alerts._published.clear()  # a cold container: it learns from the record, not from memory
    assert fire(org_config, {"premium": 900}) == []
    assert kinds(fire(org_config, {"premium": 960})) == [(THRESHOLD, "premium", 95)]
    events = bus()
    assert [(e["detail"]["type"], e["detail"]["label"], e["detail"]["threshold_pct"]) for e in events] == [
        (THRESHOLD, "premium", 80),
        (THRESHOLD, "premium", 95),
    ]
    assert put_events_calls["PutEvents"] == 2
    first = events[0]
    assert (first["source"], first["detail-type"]) == ("price-keeper", "SpendAlert")
    assert first["detail"] == {
        "type": THRESHOLD,
        "label": "premium",
        "threshold_pct": 80,
        "scope": org_config.scope,
        "org_id": org_config.org_id,
        "app_id": None,
        "date": "2026-10-01",
        "fired_at": "2026-10-01T15:00:00Z",
        "spend_usd_micros": 850,
        "quota_usd_micros": 1000,
        "fallback_to": None,
        "model_id": None,
        "region": None,
    }
    item = next(r for r in records(org_config.scope) if r["date_key"].endswith("#80"))
    assert item["published"] is True
    assert item[tables.TTL_ATTRIBUTE] == int(NOW.timestamp()) + alerts.ALERT_RETENTION_DAYS * 86400


def test_concurrent_evaluations_fire_each_alert_exactly_once(bus, put_events_calls, org_config):
    spends = {"premium": 1000, "standard": 500, "economy": 200}
    expected = due_alerts(ORDERING, QUOTAS, spends, (), (80, 95), sum(QUOTAS.values()))
    workers, start = 6, threading.Barrier(6)
    fired: list[Alert] = []

    def run():
        start.wait()
        fired.extend(fire(org_config, spends))

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(kinds(fired), key=str) == sorted(kinds(expected), key=str)
    assert put_events_calls["PutEvents"] == len(expected) == 9 + 2  # and the total cap's 80 and 95 %
    delivered = Counter((e["detail"]["type"], e["detail"]["label"], e["detail"]["threshold_pct"]) for e in bus())
    assert set(delivered.values()) == {1} and len(delivered) == len(expected)


def test_a_new_org_local_day_fires_again(bus, org_config):
    assert len(fire(org_config, {"premium": 1000})) == 3
    assert fire(org_config, {"premium": 1000}) == []
    next_day = fire(org_config, {"premium": 1000}, day="20261002", now=NOW + timedelta(days=1))
    assert kinds(next_day) == [(THRESHOLD, "premium", 80), (THRESHOLD, "premium", 95), (FALLBACK, "premium", None)]
    assert [e["detail"]["date"] for e in bus()] == ["2026-10-01"] * 3 + ["2026-10-02"] * 3


def test_fallback_and_all_exhausted_events(bus, org_config):
    fire(org_config, {}, sticky={"premium"})
    fire(org_config, {"premium": 10, "standard": 500, "economy": 200}, sticky={"premium"})
    events = [e["detail"] for e in bus()]
    fallbacks = [(e["label"], e["fallback_to"]) for e in events if e["type"] == FALLBACK]
    assert fallbacks == [("premium", "standard"), ("standard", "economy")]
    [exhausted] = [e for e in events if e["type"] == ALL_EXHAUSTED]
    assert (exhausted["label"], exhausted["threshold_pct"]) == (None, None)


def test_alerts_are_logged_as_warnings(bus, org_config, caplog):
    fire(org_config, {"premium": 800})
    [logged] = [record for record in caplog.records if record.getMessage() == "Spend alert"]
    assert logged.levelname == "WARNING" and logged.alert["threshold_pct"] == 80


def boost_premium_by_1000(org_id: str) -> orgs.EffectiveConfig:
    """An org-wide boost of 1,000 micro-USD on premium, active until 9 h after ``NOW``, as
    ``store.boosts`` writes it: its item and its entry on the org's item."""
    from price_keeper.store import boosts as boost_store

    item = {
        "org_key": keys.org_key(org_id),
        "resource_key": "BOOST#ORG#b1",
        "boost_id": "b1",
        "model_label": "premium",
        "amount_usd_micros": 1000,
        "expires_at": "2026-10-02T00:00:00Z",
        tables.TTL_ATTRIBUTE: int((NOW + timedelta(hours=9)).timestamp()),
    }
    scope_item = {"org_key": keys.org_key(org_id), "resource_key": keys.ROOT_RESOURCE}
    assert boost_store.create(item, scope_item, expired=[], room=1)
    orgs.forget(org_id)
    return orgs.effective_config(org_id)  # the org's config read again: with the boost


def test_boosted_quota_is_the_one_alerts_compare_with(bus, org_config):
    boosted = boost_premium_by_1000(org_config.org_id)
    assert fire(boosted, {"premium": 1500}) == []  # 75 % of 2000
    later = NOW + timedelta(hours=10)  # the boost expired: 150 % of 1000
    assert kinds(fire(boosted, {"premium": 1500}, now=later)) == [
        (THRESHOLD, "premium", 80),
        (THRESHOLD, "premium", 95),
        (FALLBACK, "premium", None),
        (THRESHOLD, None, 80),
    ]  # 1,500 of the 1,700 total cap


def test_spend_outside_the_ordering_fires_the_total_caps_alerts(bus, org_config):
    total = sum(QUOTAS.values())
    assert kinds(fire(org_config, {"my-profile": total * 80 // 100})) == [(THRESHOLD, None, 80)]
    assert kinds(fire(org_config, {"my-profile": total})) == [(THRESHOLD, None, 95), (ALL_EXHAUSTED, None, None)]
    assert [e["detail"]["quota_usd_micros"] for e in bus() if e["detail"]["type"] == THRESHOLD] == [total] * 2


def test_failed_publish_is_retried_by_a_later_run_once(bus, put_events_calls, org_config, monkeypatch):
    monkeypatch.setenv("ALERT_EVENT_BUS", "no-such-bus")
    assert fire(org_config, {"premium": 800}) == []
    [item] = records(org_config.scope)
    assert item["published"] is False and item["attempts"] == 1
    monkeypatch.delenv("ALERT_EVENT_BUS")
    # a run right after leaves it to the first publisher (it may still be at work)
    assert fire(org_config, {"premium": 800}, now=NOW + timedelta(seconds=5)) == []
    later = NOW + timedelta(seconds=alerts.RETRY_AFTER_SECONDS + 1)
    assert kinds(fire(org_config, {"premium": 800}, now=later)) == [(THRESHOLD, "premium", 80)]
    assert fire(org_config, {"premium": 800}, now=later + timedelta(minutes=5)) == []
    [item] = records(org_config.scope)
    assert item["published"] is True and item["attempts"] == 2
    [event] = bus()
    assert event["detail"]["fired_at"] == "2026-10-01T15:00:00Z"  # when it was first detected
    assert put_events_calls["PutEvents"] == 2


# --- GET .../alerts -----------------------------------------------------------------------


def get_alerts(api, org_id, token, date=None):
    return api.get(f"/api/v1/orgs/{org_id}/alerts", token=token, query=f"date={date}" if date else "")


def listed(kind: str, threshold_pct: int | None, app_id: str, scope: str, fired_at: str) -> dict:
    """An alert of premium as GET .../alerts lists it."""
    return {
        "type": kind,
        "label": "premium",
        "threshold_pct": threshold_pct,
        "model_id": None,
        "scope": scope,
        "app_id": app_id,
        "fired_at": fired_at,
    }


def test_get_alerts_of_a_day_from_every_scope_of_an_app_org(api, bus):
    org_id = seed_org(quota_scope="APP", model_ordering=ORDERING, quotas=QUOTAS)
    seed_app(org_id, "app-1")
    seed_app(org_id, "app-2")
    app1, app2 = orgs.effective_config(org_id, "app-1"), orgs.effective_config(org_id, "app-2")
    fire(app1, {"premium": 800})
    fire(app2, {"premium": 1000}, now=NOW + timedelta(minutes=1))
    fire(app1, {"premium": 800}, day="20261002", now=NOW + timedelta(days=1))
    reply = get_alerts(api, org_id, token_for(org_id), "2026-10-01")
    assert reply.status == 200, reply
    body = reply.json()
    assert body["date"] == "2026-10-01"
    first, second = "2026-10-01T15:00:00Z", "2026-10-01T15:01:00Z"
    assert body["alerts"] == [
        listed(THRESHOLD, 80, "app-1", app1.scope, first),
        listed(FALLBACK, None, "app-2", app2.scope, second),
        listed(THRESHOLD, 80, "app-2", app2.scope, second),
        listed(THRESHOLD, 95, "app-2", app2.scope, second),
    ]
    assert [a["scope"] for a in get_alerts(api, org_id, token_for(org_id), "2026-10-02").json()["alerts"]] == [
        app1.scope
    ]
    assert get_alerts(api, org_id, token_for(org_id), "2026-09-30").json()["alerts"] == []


def test_get_alerts_defaults_to_today_in_the_org_timezone(api, bus):
    org_id = seed_org(quota_scope="ORG", timezone="Pacific/Kiritimati", model_ordering=ORDERING, quotas=QUOTAS)
    config = orgs.effective_config(org_id)
    now = datetime.now(UTC)
    today = org_day(config.timezone, now)  # UTC+14: usually not the UTC date
    fire(config, {"premium": 800}, day=today, now=now)
    body = get_alerts(api, org_id, token_for(org_id)).json()
    assert body["date"] == f"{today[:4]}-{today[4:6]}-{today[6:]}"
    assert [(a["type"], a["scope"], a["app_id"]) for a in body["alerts"]] == [(THRESHOLD, config.scope, None)]


def test_another_orgs_alerts_never_appear(api, bus, org_config):
    other = orgs.effective_config(seed_org(quota_scope="ORG", model_ordering=ORDERING, quotas=QUOTAS))
    fire(other, {"premium": 1000})
    assert get_alerts(api, org_config.org_id, token_for(org_config.org_id), "2026-10-01").json()["alerts"] == []
    assert_error(get_alerts(api, org_config.org_id, token_for(other.org_id), "2026-10-01"), 403, "FORBIDDEN")


def test_alerts_need_an_org_token(api, aws):
    org_id = seed_org(quota_scope="APP")
    seed_app(org_id, "app-1")
    assert_error(get_alerts(api, org_id, token_for(org_id, "app-1")), 403, "FORBIDDEN")
    assert_error(get_alerts(api, org_id, None), 401, "UNAUTHORIZED")


@pytest.mark.parametrize("date", ["2026-13-01", "20261001", "yesterday"])
def test_bad_date_is_400(api, aws, date):
    org_id = seed_org()
    assert_error(get_alerts(api, org_id, token_for(org_id), date), 400, "INVALID_REQUEST")


def test_unknown_org_is_404(api, aws):
    org_id = str(uuid.uuid4())
    assert_error(get_alerts(api, org_id, token_for(org_id)), 404, "NOT_FOUND")


def test_aggregator_run_fires_threshold_alert_once(api, bus, fold_stream):
    """Usage over HTTP -> aggregator function (the stream's batch, in its role: folding, alert
    claims and records) -> THRESHOLD 80 % event, once however often it runs."""
    from tests.usage_support import new_tenant, usage_body

    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202  # 3,760 µ$: 94 %
    assert fold_stream()["alerts_fired"] == 1
    assert (
        api.post(f"{tenant.app_path}/usage", usage_body(input_tokens=1, output_tokens=0), token=tenant.token).status
        == 202
    )
    assert fold_stream()["alerts_fired"] == 0
    events = bus()
    assert [(e["detail"]["type"], e["detail"]["label"], e["detail"]["threshold_pct"]) for e in events] == [
        ("THRESHOLD", "premium", 80)
    ]
    listed = api.get(f"{tenant.org_path}/alerts", token=tenant.org_token).json()["alerts"]
    assert [(a["type"], a["label"], a["threshold_pct"]) for a in listed] == [("THRESHOLD", "premium", 80)]


def test_the_audit_fires_an_alert_the_folds_that_crossed_it_missed(api, bus):
    """Two concurrent folds of two labels of a scope each read the other's total eventually
    consistent, and can each miss the sum that crosses a threshold; past the total cap
    selection stops the clients, and no later fold comes to see it. The audit evaluates the
    alerts of every scope-day it reads, moved or not, so such an alert fires within its
    period. Here the folds' alerts are skipped (the domain fold, without the handler's
    evaluation), and the scheduled run, which moves nothing, fires it."""
    from local.gateway import LambdaContext, load_handler
    from tests.iam_check import only_granted
    from tests.usage_support import fold_usage, new_tenant, usage_body

    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202  # 3,760 µ$: 94 %
    assert fold_usage().totals_written == 1  # folded (a config label: its total alone); no alert evaluated
    assert bus() == []
    with only_granted("aggregator"):
        audit = load_handler("aggregator")({}, LambdaContext(function_name="aggregator"))
    assert (audit["totals_written"], audit["alerts_fired"]) == (0, 1)
    assert [(e["detail"]["type"], e["detail"]["label"], e["detail"]["threshold_pct"]) for e in bus()] == [
        ("THRESHOLD", "premium", 80)
    ]


def test_the_audit_raises_no_alert_for_a_past_day_on_quotas_that_are_todays(api, bus):
    """The audit evaluates an unmoved scope-day only on the scope's today: yesterday's spend,
    below yesterday's quota, is not alerted on because the quota was lowered since (red-team
    note: it fired a THRESHOLD 80 % for yesterday on today's quota)."""
    from price_keeper.domain import repair
    from price_keeper.timeutil import utc_now
    from tests.usage_support import fold_usage, new_tenant, usage_body

    tenant = new_tenant(quotas={"premium": 100_000, "standard": 5_000_000, "economy": 2_000_000})
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202  # 3,760 µ$: 4 %
    assert fold_usage().totals_written == 1
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(tenant.org_id), "resource_key": keys.ROOT_RESOURCE},
        UpdateExpression="SET quotas.premium = :lowered",
        ExpressionAttributeValues={":lowered": 4_000},
    )
    orgs.forget(tenant.org_id)
    tomorrow = utc_now() + timedelta(days=1)
    audit = repair.run(tomorrow)  # yesterday is still in play; nothing moves
    assert audit.totals_written == 0
    assert alerts.fire_after_run(audit, tomorrow) == [] and bus() == []
    today = repair.run()  # the same spend on its own day, against the lowered quota: 94 %
    assert [(alert.type, alert.label, alert.threshold_pct) for alert in alerts.fire_after_run(today, utc_now())] == [
        (alerts.THRESHOLD, "premium", 80)
    ]


def test_a_scope_whose_alerting_fails_neither_fails_the_run_nor_stops_other_scopes(bus, org_config, caplog):
    """Spend of an org that is no longer registered (its config read is a 404) is folded and
    logged; the registered org in the same run still gets its alert."""
    from price_keeper.timeutil import utc_now
    from tests.usage_support import fold_usage, put_records

    now = utc_now()
    day = org_day(org_config.timezone, now)
    ghost_scope = keys.org_key(str(uuid.uuid4()))
    for scope, cost in ((ghost_scope, 10_000), (org_config.scope, 900)):  # the ghost: 1,000 %; ours: 90 %
        put_records(scope, "premium", day=day, cost=cost)
    report = fold_usage(now)
    assert report.totals_written == 2  # a label total each
    fired = alerts.fire_after_run(report, now)
    assert kinds(fired) == [(THRESHOLD, "premium", 80)]
    assert [e["detail"]["scope"] for e in bus()] == [org_config.scope]
    assert records(ghost_scope) == []
    assert "alert evaluation failed" in caplog.text


# --- SpendPct: how close the scopes a run changed are to their quotas ----------------------


def changed(*totals: tuple[str, str, str, int]) -> RunReport:
    """An aggregation run that changed these (scope, label, yyyymmdd, cost) totals (and so
    evaluates their scopes' alerts)."""
    return RunReport(
        days=[DAY],
        costs=[(keys.usage_key(scope, label), day, cost) for scope, label, day, cost in totals],
        changed=[(keys.usage_key(scope, label), day) for scope, label, day, _ in totals],
        evaluated=list(dict.fromkeys((scope, day) for scope, _, day, _ in totals)),
    )


def test_spend_pcts_are_each_quota_and_the_total_cap_of_a_changed_scope(org_config):
    report = changed(
        *(
            (org_config.scope, label, DAY, cost)
            for label, cost in (("premium", 800), ("standard", 100), ("my-profile", 50))
        )
    )
    # premium, standard, economy of the ordering; then 950 of the 1,700 total cap
    assert alerts.spend_pcts(report, NOW) == [80.0, 20.0, 0.0, 55.9]


def test_spend_pcts_count_active_boosts(org_config):
    boost_premium_by_1000(org_config.org_id)
    report = changed((org_config.scope, "premium", DAY, 800))
    assert alerts.spend_pcts(report, NOW) == [40.0, 0.0, 0.0, 29.6]  # 800 of 2,000; of the 2,700 cap


def test_spend_pcts_leave_out_other_days_former_scopes_and_unreadable_configs(org_config, caplog):
    yesterday = (datetime.strptime(DAY, "%Y%m%d") - timedelta(days=1)).strftime("%Y%m%d")
    ghost = keys.org_key(str(uuid.uuid4()))
    app_counters = keys.scope_key(org_config.org_id, "app-1", "APP")  # the org is ORG-scoped now
    report = changed(
        (org_config.scope, "premium", yesterday, 900), (ghost, "premium", DAY, 900), (app_counters, "premium", DAY, 900)
    )
    assert alerts.spend_pcts(report, NOW) == []
    assert "spend % of quota not computed" in caplog.text  # the ghost's 404


def test_the_aggregator_publishes_spend_pct_and_its_lag(api, bus, emitted_metrics, fold_stream):
    from tests.usage_support import new_tenant, usage_body

    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202  # 3,760 µ$
    fold_stream()  # the stream's batch, in the aggregator's role
    published = emitted_metrics()
    assert published[SPEND_PCT] == [94.0, 0.0, 0.0, 0.1]  # of 4,000, 5M, 2M; of the 7,004,000 cap
    assert len(published[AGGREGATOR_LAG_SECONDS]) == 1


# --- thresholds per org ------------------------------------------------------------------


def test_an_org_sets_its_own_alert_thresholds(api, bus):
    org_id, _ = new_org(
        api,
        quota_scope="ORG",
        model_ordering=list(ORDERING),
        quotas=QUOTAS,
        overrides={"alert_thresholds_pct": [90, 50, 90]},
    )
    config = orgs.effective_config(org_id)
    assert config.alert_thresholds_pct == (50, 90)
    fired = fire(config, {"premium": 500})
    assert kinds(fired) == [(THRESHOLD, "premium", 50)]  # config.yaml's 80 and 95 are not this org's
    assert put_org(api, org_id, org_body(quota_scope="ORG", model_ordering=list(ORDERING), quotas=QUOTAS)).status == 200
    assert orgs.effective_config(org_id).alert_thresholds_pct == (80, 95)  # left out: the service's again


@pytest.mark.parametrize("thresholds", [[0], [101], [], ["80"], [True], list(range(1, 12))])
def test_org_alert_thresholds_out_of_range_are_400(api, aws, thresholds):
    reply = put_org(api, str(uuid.uuid4()), org_body(overrides={"alert_thresholds_pct": thresholds}))
    assert_error(reply, 400, "INVALID_REQUEST")


def test_apps_take_the_orgs_alert_thresholds(api, aws):
    org_id, _ = new_org(api, overrides={"alert_thresholds_pct": [60]})
    assert_error(
        put_app(api, org_id, "app-1", {"app_name": "A", "overrides": {"alert_thresholds_pct": [70]}}),
        400,
        "INVALID_REQUEST",
    )
    assert put_app(api, org_id, "app-1", {"app_name": "A"}).status == 201
    assert orgs.effective_config(org_id, "app-1").alert_thresholds_pct == (60,)
