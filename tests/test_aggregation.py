"""Totals, their readers and the audit, on moto: every reader counts a scope's spend over
every label (its scope total and the config labels' totals kept apart from it); the hourly
audit lists the label-days of the days in play from the ``active-by-day`` index, evaluates
today's alerts against the totals as they stand (folding nothing: ``tests/test_ledger.py``
has the fold), and fans out over the repair queue."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import pytest
import yaml

from local.gateway import LambdaContext, load_handler
from price_keeper import state
from price_keeper.aws import events as alert_events
from price_keeper.config import config_path, get_config
from price_keeper.domain import aggregation, alerts, ledger, repair
from price_keeper.errors import ApiError
from price_keeper.store import alert_records, daily_totals, keys, tables, usage
from price_keeper.store.dynamo import ddb_client, table
from price_keeper.timeutil import org_day, utc_now
from tests.conftest import keys_asked
from tests.factories import seed_org
from tests.iam_check import only_granted
from tests.test_ledger import PROFILE_ARN, SHARD, _records, operations, stream, submit  # noqa: F401 - stream: a fixture
from tests.usage_support import new_tenant, spent_labels, usage_body

NOW = datetime(2026, 1, 23, 15, 30, tzinfo=UTC)
DAY = "20260123"
ZONE = "America/New_York"  # new_tenant's


def scope_total(scope: str, day: str) -> dict | None:
    return (
        table(tables.DAILY_TOTAL)
        .get_item(Key={"usage_key": keys.scope_total_key(scope), "date_key": keys.day_key(day)})
        .get("Item")
    )


def report_body(label: str, input_tokens: int) -> dict:
    """A record of ``label`` costing ``input_tokens`` x its input price (a profile's: Nova Pro's)."""
    profile = {} if label in get_config().labels else {"calling_region": "us-east-1"}
    return usage_body(model_label=label, input_tokens=input_tokens, output_tokens=0, **profile)


def set_total_cap(org_id: str, cap: int) -> None:
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(org_id), "resource_key": keys.ROOT_RESOURCE},
        UpdateExpression="SET total_quota_usd_micros = :cap",
        ExpressionAttributeValues={":cap": cap},
    )


# --- readers: a scope's spend over every label -----------------------------------------------


def test_every_reader_counts_every_label_in_the_scopes_spend(api, fold_stream, bedrock_endpoint):
    """A label of the ordering, a config label outside it and any other label (a profile's):
    the scope's spend is their sum for the total cap in selection, the usage answer,
    aggregates and the spend report, though the scope total holds the profile's alone (the
    config labels are kept apart from it, each in its own total)."""
    from tests.factories import seed_profiles

    tenant = new_tenant()
    seed_profiles(tenant.org_id, tenant.app_id, ["my-profile"], PROFILE_ARN)
    day = org_day(ZONE)
    spends = {}
    for label, tokens in {"premium": 1_000, "ultra_premium": 2_000, "my-profile": 4_000}.items():
        reply = api.post(tenant.app_path + "/usage", report_body(label, tokens), token=tenant.token)
        assert reply.status == 202, reply
        spends[label] = reply.json()["processing"]["cost_usd_micros"]
    assert len(set(spends.values())) == 3
    fold_stream()
    assert scope_total(tenant.scope, day)["cost_usd_micros"] == spends["my-profile"]
    assert spent_labels(tenant.scope, day) == {"my-profile"}  # a config label is never listed: readers read them all
    spent = sum(spends.values())
    selection = api.get(tenant.app_path + "/model-selection", token=tenant.token).json()
    assert selection["quota_status"]["total"]["spend_usd_micros"] == spent
    aggregates = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).json()
    assert aggregates["total_cost_usd_micros"] == spent
    assert {label: aggregates["models"][label]["cost_usd_micros"] for label in spends} == spends
    on = f"{day[:4]}-{day[4:6]}-{day[6:]}"
    rows = api.get(
        f"/api/v1/orgs/{tenant.org_id}/reports/spend", token=tenant.org_token, query=f"from={on}&to={on}"
    ).json()
    assert {row["label"]: row["cost_usd_micros"] for row in rows["rows"]} == spends
    answer = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).json()
    assert answer["scope_total"]["spend_usd_micros"] == spent  # as folded: this record not yet


def test_a_label_removed_from_config_yaml_keeps_its_spend_in_the_scopes_spend(api, fold_stream, monkeypatch, tmp_path):
    """An operator retires a config.yaml label during a day it was spent on. That spend is
    only in the label's own total: every reader still adds it (``orgs.config_labels_ever``:
    the aggregator stored the label before folding it), so the total cap and the hard cap
    still count it and the spend report still shows it."""
    tenant = new_tenant(model_ordering=("premium", "standard"))
    set_total_cap(tenant.org_id, 30_000)
    day = org_day(ZONE)
    reply = api.post(tenant.app_path + "/usage", report_body("ultra_premium", 25_000), token=tenant.token)
    assert reply.json()["processing"]["cost_usd_micros"] == 20_000
    fold_stream()

    retired = tmp_path / "config.yaml"
    raw = yaml.safe_load(config_path().read_text())
    del raw["model_labels"]["ultra_premium"]
    retired.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("PRICE_KEEPER_CONFIG", str(retired))
    state.reset()  # the containers of the new deployment
    assert "ultra_premium" not in get_config().labels

    selection = api.get(tenant.app_path + "/model-selection", token=tenant.token).json()
    assert selection["quota_status"]["total"]["spend_usd_micros"] == 20_000
    aggregates = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).json()
    assert aggregates["total_cost_usd_micros"] == 20_000
    on = f"{day[:4]}-{day[4:6]}-{day[6:]}"
    rows = api.get(
        f"/api/v1/orgs/{tenant.org_id}/reports/spend", token=tenant.org_token, query=f"from={on}&to={on}"
    ).json()
    assert {row["label"]: row["cost_usd_micros"] for row in rows["rows"] if row["cost_usd_micros"]} == {
        "ultra_premium": 20_000
    }
    # premium's worst case (20,000 input tokens: 16,000 micro-USD) no longer fits the cap's 10,000 left
    reservation = {"model_label": "premium", "max_input_tokens": 20_000, "max_output_tokens": 0}
    assert api.post(tenant.app_path + "/reservations", reservation, token=tenant.token).status == 429


def test_the_total_caps_alerts_count_the_config_labels_kept_apart(api, fold_stream):
    """The fold's scope spend for alerts is its scope total's and every config label's: 80 %
    of the total cap spent on a config label outside the ordering fires its threshold."""
    tenant = new_tenant()
    set_total_cap(tenant.org_id, 25_000)
    day = org_day(ZONE)
    reply = api.post(tenant.app_path + "/usage", report_body("ultra_premium", 25_000), token=tenant.token)
    assert reply.json()["processing"]["cost_usd_micros"] == 20_000
    fold_stream()
    fired = alert_records.of_day(tenant.scope, day)
    assert [item["date_key"] for item in fired.values()] == [keys.alert_date_key(day, alerts.THRESHOLD, "-", "80")]
    assert scope_total(tenant.scope, day) is None  # the config label's spend is not in it


def test_a_reader_lists_at_most_400_labels_of_a_scope(aws, monkeypatch):
    monkeypatch.setattr(daily_totals, "MAX_LISTED_LABELS", 5)  # 400 deployed: the same code path
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    with table(tables.DAILY_TOTAL).batch_writer() as batch:
        for n in range(8):
            batch.put_item(Item=keys.spent_label_key(scope, f"DAY#{DAY}", f"profile-{n}"))
    assert spent_labels(scope, DAY) == {f"profile-{n}" for n in range(5)}


def test_an_app_registers_at_most_400_profiles(aws):
    from price_keeper.domain import orgs, profiles
    from price_keeper.store import profiles as profile_store

    org_id = seed_org()
    with table(tables.CONFIG).batch_writer() as batch:
        batch.put_item(Item={"org_key": keys.org_key(org_id), "resource_key": keys.app_resource("app-1")})
        for n in range(profiles.MAX_PROFILES_PER_APP):
            batch.put_item(Item={**profile_store.profile_key(org_id, "app-1", f"p-{n}"), "profile_label": f"p-{n}"})
    config = orgs.effective_config(org_id, "app-1")
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
    with pytest.raises(ApiError) as refused:
        profiles.register(config, "one-more", arn, None)
    assert (refused.value.status, refused.value.code) == (400, "INVALID_REQUEST")
    assert refused.value.details == {"limit": 400, "registered": 400}
    assert "one-more" not in profile_store.labels(org_id, "app-1")


# --- the audit ------------------------------------------------------------------------------------


def list_day(scope: str, label: str, day: str) -> None:
    """A label-day's entry in the ``active-by-day`` index, as its first record writes it."""
    now = int(utc_now().timestamp())
    ddb_client().update_item(**usage.day_listed(scope, label, day, now, aggregation.usage_expires_at(day))["Update"])


def fold_quietly(records: list[dict]) -> None:
    """The fold of ``records`` without the alerts its handler fires after it (as when two
    concurrent folds of a scope both missed a level-triggered alert)."""
    assert ledger.fold_batch(_records(records), SHARD).resume_at is None


def test_a_days_label_days_index_under_16_keys_by_org_and_the_audit_and_the_spend_check_find_them(aws):
    """New label-days of many orgs at a day's start spread their index entries over the
    day's 16 partition keys (one org, one key)."""
    scopes = [keys.org_key(str(uuid.uuid4())) for _ in range(64)]
    for scope in scopes:
        list_day(scope, "premium", DAY)
    indexed = table(tables.USAGE_AGG_SHARDED).scan(ProjectionExpression="active_day")["Items"]
    assert len({item["active_day"] for item in indexed}) >= 12  # 64 orgs over 16 keys
    assert sorted(usage.active_label_days(DAY)) == sorted(
        (keys.usage_key(s, "premium"), keys.day_key(DAY)) for s in scopes
    )
    assert usage.active_label_days("20260124") == []
    assert usage.org_has_spend(keys.split_scope(scopes[0])[0], DAY)
    assert not usage.org_has_spend(str(uuid.uuid4()), DAY)


def test_the_audit_evaluates_todays_scope_days_of_the_days_in_play_and_writes_nothing_but_its_heartbeat(
    stream, dynamodb_calls
):
    """The work grows with the label-days written, not with the orgs: the index's keys of
    each day in play are Queried (no Scan); today's scope-days of registered orgs are
    evaluated against their totals (one read), another day's or a gone org's are not."""
    for _ in range(30):
        seed_org()  # registered, idle
    tenant = new_tenant()
    receipt = submit(tenant)
    fold_quietly(stream())
    today = org_day(ZONE)
    days = aggregation.days_in_play(utc_now())
    # the latest other day in play: tomorrow, or a yesterday ended under a day ago; never a day
    # settled, which the audit would re-derive (the earliest in play is, at some hours)
    in_play_not_today = max(day for day in days if day != today)
    list_day(tenant.scope, "standard", in_play_not_today)
    closed = (utc_now() - timedelta(days=5)).strftime("%Y%m%d")
    list_day(tenant.scope, "economy", closed)
    gone = keys.scope_key(str(uuid.uuid4()), "app-1", "APP")
    list_day(gone, "premium", today)
    dynamodb_calls.clear()
    report = repair.run()
    calls = operations(dynamodb_calls)
    # the index pages of each day in play, and of the one more day only re-derivation reads
    assert "Scan" not in calls and calls["Query"] == (len(days) + 1) * keys.ACTIVE_DAY_BUCKETS
    writes = [params for op, params in dynamodb_calls if op in ("PutItem", "UpdateItem", "TransactWriteItems")]
    assert [params["Item"]["usage_key"] for params in writes] == [keys.HEARTBEAT_KEY["usage_key"]]
    assert (report.days, report.totals_written, report.evaluated) == (days, 0, [(tenant.scope, today)])
    assert report.scope_costs == {(tenant.scope, today): receipt["processing"]["cost_usd_micros"]}
    totals_read = [
        key["usage_key"]
        for op, params in dynamodb_calls
        for key in keys_asked(op, params, tables.DAILY_TOTAL)
        if key.get("date_key", "").startswith("DAY#")
    ]
    assert totals_read and all(usage_key.startswith(tenant.scope) for usage_key in totals_read)


def test_the_scheduled_audit_fires_the_alerts_a_fold_missed_and_reports_the_run(stream):
    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    submit(tenant)  # 94 % of premium's quota
    fold_quietly(stream())
    assert alert_records.of_day(tenant.scope, org_day(ZONE)) == {}

    def scheduled() -> dict:
        with only_granted("aggregator"):
            return load_handler("aggregator")({"source": "aws.events"}, LambdaContext("aggregator"))

    reply = scheduled()  # no repair queue: the audit in this invocation
    assert (reply["alerts_fired"], reply["evaluated"], reply["totals_written"], reply["trigger"]) == (
        1,
        1,
        0,
        "schedule",
    )
    assert len(alert_records.of_day(tenant.scope, org_day(ZONE))) == 1  # THRESHOLD 80 %
    assert scheduled()["alerts_fired"] == 0  # fired once


# --- the audit fanned out over the repair queue -----------------------------------------------------


@pytest.fixture
def repair_queue(aws, monkeypatch):
    """The repair queue on moto's SQS, as the local stack runs it (``local.streams``);
    ``drain()`` delivers its messages to the aggregator (within its role) as the queue's
    event source mapping does, 10 at a time, until none is left; the invocations made."""
    import threading

    from local.streams import RepairQueue, RepairTrigger

    monkeypatch.setenv("REPAIR_QUEUE_URL", "")  # RepairQueue sets it, as the local stack does: undone after the test
    queue = RepairQueue()
    trigger = RepairTrigger("aggregator", queue, threading.Event())

    def drain() -> int:
        with only_granted("aggregator"):
            invocations = 0
            while trigger.deliver():
                invocations += 1
            return invocations

    drain.queue = queue
    return drain


def written_tables(calls: list[tuple[str, dict]]) -> set[str]:
    """The tables ``calls`` (``dynamodb_calls``) wrote to."""
    written = set()
    for operation, params in calls:
        if operation in ("PutItem", "UpdateItem", "DeleteItem"):
            written.add(params["TableName"])
        elif operation == "TransactWriteItems":
            written |= {next(iter(action.values()))["TableName"] for action in params["TransactItems"]}
    return written


def schedule() -> dict:
    """The aggregator's EventBridge schedule, within its role."""
    with only_granted("aggregator"):
        return load_handler("aggregator")({"source": "aws.events"}, LambdaContext("aggregator"))


@pytest.mark.parametrize("chunk", [10, pytest.param(repair.AUDIT_CHUNK, marks=pytest.mark.slow)])
def test_the_audit_fans_out_over_the_repair_queue_in_chunks(repair_queue, stream, dynamodb_calls, monkeypatch, chunk):
    """2.7 chunks of label-days: 3 messages, whose audit fires the alert a fold missed and
    writes no total. Chunks of 10 in every run; the deployed 100 in ``make test``."""
    monkeypatch.setattr(repair, "AUDIT_CHUNK", chunk)
    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    submit(tenant)  # 94 % of premium's quota
    fold_quietly(stream())
    today = org_day(ZONE)
    yesterday = (utc_now() - timedelta(days=1)).strftime("%Y%m%d")  # still open somewhere
    scopes = [keys.scope_key(str(uuid.uuid4()), "app-1", "APP") for _ in range(chunk * 13 // 10)]
    for scope in scopes:
        list_day(scope, "premium", today)
        list_day(scope, "standard", yesterday)
    dynamodb_calls.clear()
    planned = schedule()  # only the plan
    assert (planned["label_days"], planned["messages"]) == (2 * len(scopes) + 1, 3)
    # the index, one page a key; the timezones of the orgs that spent on a day that may be due
    # to be re-derived (``rederive.due_org_days``); the heartbeat
    assert set(operations(dynamodb_calls)) == {"Query", "BatchGetItem", "PutItem"}
    dynamodb_calls.clear()
    assert repair_queue() == 1  # 3 messages, one invocation of up to 10
    assert written_tables(dynamodb_calls) == {tables.STICKY_STATE.physical_name}  # the alert's record alone
    assert len(alert_records.of_day(tenant.scope, today)) == 1  # THRESHOLD 80 %
    assert schedule()["messages"] == 3
    dynamodb_calls.clear()
    repair_queue()
    assert written_tables(dynamodb_calls) == set()  # fired once


def test_the_audit_sends_each_batch_of_messages_within_sqs_limits(repair_queue, monkeypatch):
    """Chunks of label-days of the longest ids are ~20 KB a message: a SendMessageBatch
    carries at most ``SEND_BATCH_BYTES`` of them (64 KiB here, SQS's 256 KiB deployed: the
    same code path) and 10, and every chunk is enqueued."""
    from price_keeper.aws import client

    monkeypatch.setattr("price_keeper.aws.repair_queue.SEND_BATCH_BYTES", 64 * 1024)
    org_id, app_id = str(uuid.uuid4()), "a" * 64
    scope = keys.scope_key(org_id, app_id, "APP")
    label_days = [(keys.usage_key(scope, f"{n:04d}".ljust(64, "x")), keys.day_key(DAY)) for n in range(2_000)]
    monkeypatch.setattr(usage, "active_label_days", lambda day: label_days if day == DAY else [])
    sizes = []

    def measure(params, **_):
        sizes.append((len(params["Entries"]), sum(len(entry["MessageBody"].encode()) for entry in params["Entries"])))

    client("sqs").meta.events.register("provide-client-params.sqs.SendMessageBatch", measure)
    planned = repair.plan_audit(NOW)
    assert (planned["label_days"], planned["messages"]) == (2_000, 20)
    assert all(count <= 10 and size <= 64 * 1024 for count, size in sizes) and len(sizes) > 2
    assert sum(count for count, _ in sizes) == 20 and max(size for _, size in sizes) > 40 * 1024


def test_an_unreadable_repair_message_comes_back_alone_and_the_others_are_audited(stream):
    """A repair delivery with an audit chunk, a message that is no audit chunk and a
    malformed body: the audit chunk is audited and only the other two are named failed
    (red-team note: an unreadable message raised out of the worker, so the whole delivery
    came back and, after its receives, went to the dead-letter queue, audited chunks too)."""
    tenant = new_tenant()
    receipt = submit(tenant)
    fold_quietly(stream())
    today = org_day(ZONE)
    gone = {
        "streamArn": "arn:aws:dynamodb:us-east-1:123456789012:table/old-usage/stream/2020-01-01T00:00:00.000",
        "shardId": "shardId-00000001700000000000-abcdef12",
        "startSequenceNumber": "100000000000000000001",
        "endSequenceNumber": "100000000000000000009",
        "batchSize": 1,
    }
    repaired = repair.repair(
        {
            "audit": json.dumps({"audit": [[keys.usage_key(tenant.scope, "premium"), keys.day_key(today)]]}),
            "gone stream": json.dumps(
                {"requestContext": {"condition": "RetryAttemptsExhausted"}, "DDBStreamBatchInfo": gone}
            ),
            "malformed": "{not json",
        }
    )
    assert repaired.failed_messages == ["gone stream", "malformed"]
    assert repaired.report.evaluated == [(tenant.scope, today)]
    assert repaired.report.scope_costs == {(tenant.scope, today): receipt["processing"]["cost_usd_micros"]}


def test_the_aggregator_names_an_unreadable_repair_message_so_it_comes_back(repair_queue, stream, monkeypatch):
    """Through the handler and the queue: the reply names the malformed message, and the
    audited one is deleted."""
    import local.streams

    replies = []
    invoke = local.streams.invoke_job
    monkeypatch.setattr(local.streams, "invoke_job", lambda *args: replies.append(invoke(*args)) or replies[-1])
    tenant = new_tenant()
    submit(tenant)
    fold_quietly(stream())
    sqs, url = repair_queue.queue.sqs, repair_queue.queue.url
    body = {"audit": [[keys.usage_key(tenant.scope, "premium"), keys.day_key(org_day(ZONE))]]}
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    malformed = sqs.send_message(QueueUrl=url, MessageBody="{not json")["MessageId"]
    assert repair_queue() == 1
    assert replies == [{"batchItemFailures": [{"itemIdentifier": malformed}]}]
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (left["ApproximateNumberOfMessages"], left["ApproximateNumberOfMessagesNotVisible"]) == ("0", "1")
