"""The aggregator on moto: folds exactly the active shards of the days in play into
DailyTotal, idempotently, never backwards, without scans, and reports its lag."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial

import boto3
import pytest
import yaml

from local.gateway import LambdaContext, load_handler
from price_keeper import state
from price_keeper.config import config_path, get_config
from price_keeper.domain import aggregation, alerts, repair
from price_keeper.errors import ApiError
from price_keeper.store import alert_records, daily_totals, dynamo, keys, tables, usage
from price_keeper.store.dynamo import ddb_client, table
from price_keeper.timeutil import org_day, utc_now
from tests import usage_support
from tests.factories import seed_org
from tests.usage_support import daily_total, new_tenant, usage_body

NOW = datetime(2026, 1, 23, 15, 30, tzinfo=UTC)
DAY = "20260123"
put_shard = partial(usage_support.put_shard, day=DAY, updated_at=int(NOW.timestamp()) - 5)

spent_labels = partial(usage_support.spent_labels, day=DAY)


def total(scope: str, label: str, day: str = DAY) -> dict | None:
    return daily_total(scope, label, day)


@pytest.fixture
def calls(aws):
    """DynamoDB operations made through the service's client, with the keys they asked for."""
    seen = Counter()
    keys_read = []

    def count(params, model, **_):
        seen[model.name] += 1
        for request in params.get("RequestItems", {}).values():
            keys_read.extend(request.get("Keys", []))

    ddb_client().meta.events.register("before-parameter-build.dynamodb", count)
    return seen, keys_read


def test_shards_fold_into_daily_totals(aws):
    put_shard("ORG#a", "premium", 0, cost=100, requests=1)
    put_shard("ORG#a", "premium", 5, cost=250, requests=3)
    put_shard("ORG#a", "standard", 1, cost=7)
    put_shard("ORG#b#APP#x", "premium", 2, cost=40, requests=2)
    report = aggregation.run(NOW)
    assert (report.active_shards, report.usage_keys, report.totals_written) == (4, 3, 5)  # 3 labels, 2 scopes
    scope_total = table(tables.DAILY_TOTAL).get_item(Key={"usage_key": "ORG#a#TOTAL", "date_key": f"DAY#{DAY}"})["Item"]
    assert (scope_total["cost_usd_micros"], scope_total["requests"], spent_labels("ORG#a")) == (
        357,
        5,
        {"premium", "standard"},
    )
    premium = total("ORG#a", "premium")
    assert (premium["cost_usd_micros"], premium["requests"], premium["input_tokens"], premium["output_tokens"]) == (
        350,
        4,
        40,
        20,
    )
    assert total("ORG#a", "standard")["cost_usd_micros"] == 7
    assert total("ORG#b#APP#x", "premium")["requests"] == 2
    assert premium["updated_at_epoch"] == int(NOW.timestamp())
    assert premium["expires_at_epoch"] == aggregation.usage_expires_at(DAY)


def test_a_second_run_writes_nothing_and_a_change_rewrites_one_total(aws):
    put_shard("ORG#a", "premium", 0)
    put_shard("ORG#a", "standard", 0)
    aggregation.run(NOW)
    again = aggregation.run(NOW + timedelta(minutes=1))
    assert again.totals_written == 0 and again.lag_seconds == 0
    put_shard("ORG#a", "premium", 3, cost=900, updated_at=int(NOW.timestamp()) + 90)
    third = aggregation.run(NOW + timedelta(minutes=2))
    assert third.totals_written == 2  # premium and the scope's total
    assert total("ORG#a", "premium")["cost_usd_micros"] == 1000


def test_a_total_never_moves_backwards(aws):
    put_shard("ORG#a", "premium", 0, cost=100, requests=1)
    table(tables.DAILY_TOTAL).put_item(
        Item={"usage_key": "ORG#a#LABEL#premium", "date_key": f"DAY#{DAY}", "cost_usd_micros": 500, "requests": 5}
    )  # a newer run's total
    report = aggregation.run(NOW)
    assert (report.totals_written, report.stale_puts_skipped) == (0, 1)
    assert total("ORG#a", "premium")["cost_usd_micros"] == 500


def test_only_the_org_days_in_play_are_folded(aws):
    put_shard("ORG#a", "premium", 0, day="20260121")  # UTC today - 2: a previous org day, still open
    put_shard("ORG#a", "premium", 0, day="20260124")  # UTC tomorrow: Auckland's today
    put_shard("ORG#a", "premium", 0, day="20260120")  # closed everywhere
    report = aggregation.run(NOW)
    assert report.days == ["20260121", "20260122", "20260123", "20260124"]
    assert total("ORG#a", "premium", "20260121") and total("ORG#a", "premium", "20260124")
    assert total("ORG#a", "premium", "20260120") is None


def test_work_grows_with_active_scopes_not_with_all_orgs(calls):
    seen, keys_read = calls
    for _ in range(30):
        seed_org()  # registered, idle
    put_shard("ORG#a", "premium", 0)
    put_shard("ORG#a", "premium", 1)
    put_shard("ORG#b", "economy", 7)
    seen.clear()
    aggregation.run(NOW)
    assert "Scan" not in seen
    assert seen["Query"] == 4 * (keys.ACTIVE_DAY_BUCKETS + 1)  # per day in play: its index buckets, its bare key
    # the orgs' configs, read again strongly when not found (not registered here); shards and totals together
    assert seen["BatchGetItem"] == 3
    assert seen["TransactWriteItems"] == 2  # one per scope: its label totals and its scope total
    assert seen["PutItem"] == 1  # the heartbeat
    assert len(keys_read) == 2 * 2 + 3 + 2 + 2 + 2  # configs (twice), shards, shard counts, label totals, scope totals


def test_a_days_shards_index_under_16_keys_by_org_and_the_audit_reads_them_and_the_bare_day_key(aws):
    """New shards of many orgs at a day's start spread their index entries over the day's
    16 partition keys (one org, one key); shards indexed under the bare ``DAY#`` key (made
    before the buckets) are still found by the audit and by the spend check."""
    scopes = [keys.org_key(str(uuid.uuid4())) for _ in range(64)]
    for scope in scopes:
        put_shard(scope, "premium", 0, cost=5)
    legacy = keys.org_key(str(uuid.uuid4()))
    put_shard(legacy, "premium", 0, cost=7)
    table(tables.USAGE_AGG_SHARDED).update_item(
        Key={"shard_key": keys.shard_key(legacy, "premium", 0), "date_key": keys.day_key(DAY)},
        UpdateExpression="SET active_day = :day",
        ExpressionAttributeValues={":day": keys.day_key(DAY)},
    )
    indexed = table(tables.USAGE_AGG_SHARDED).scan(ProjectionExpression="active_day")["Items"]
    assert len({item["active_day"] for item in indexed}) >= 12  # 64 orgs over 16 keys, and the bare one
    aggregation.run(NOW)
    assert all(total(scope, "premium")["cost_usd_micros"] == 5 for scope in scopes)
    assert total(legacy, "premium")["cost_usd_micros"] == 7
    org_of = keys.split_scope
    assert usage.org_has_spend(org_of(legacy)[0], DAY) and usage.org_has_spend(org_of(scopes[0])[0], DAY)
    assert not usage.org_has_spend(str(uuid.uuid4()), DAY)


def test_lag_is_the_age_of_the_oldest_unfolded_update(aws):
    put_shard("ORG#a", "premium", 0, updated_at=int(NOW.timestamp()) - 42)
    put_shard("ORG#a", "premium", 1, updated_at=int(NOW.timestamp()) - 10)
    assert aggregation.run(NOW).lag_seconds == 42
    put_shard("ORG#a", "premium", 1, cost=500, requests=2, updated_at=int(NOW.timestamp()) + 30)
    assert aggregation.run(NOW + timedelta(seconds=50)).lag_seconds == 20
    heartbeat = table(tables.DAILY_TOTAL).get_item(Key=keys.HEARTBEAT_KEY)["Item"]
    assert heartbeat["last_run_epoch"] == int(NOW.timestamp()) + 50 and heartbeat["lag_seconds"] == 20


def test_a_run_that_fails_half_way_is_completed_by_the_next(aws, monkeypatch):
    scopes = ("ORG#a", "ORG#b", "ORG#c")
    for scope in scopes:
        put_shard(scope, "premium", 0, cost=11)
        put_shard(scope, "standard", 0, cost=4)
    real_fold = daily_totals.fold_scope
    written = []

    def fail_after_one(*args):
        if written:
            raise RuntimeError("Lambda timed out")
        written.append(real_fold(*args))
        return written[-1]

    monkeypatch.setattr(aggregation, "FOLD_THREADS", 1)
    monkeypatch.setattr(daily_totals, "fold_scope", fail_after_one)
    assert aggregation.run(NOW).failed == [("ORG#b", DAY), ("ORG#c", DAY)]  # logged; ORG#a folded
    monkeypatch.setattr(daily_totals, "fold_scope", real_fold)
    assert aggregation.run(NOW).totals_written == 2 * (2 + 1)  # the two scopes left: two labels and the total each
    assert all(scope_total(scope)["cost_usd_micros"] == 15 for scope in scopes)


def test_one_scope_failing_never_stops_the_others_and_its_batch_is_retried(stream, monkeypatch):
    """A tenant whose fold fails (here: its transaction is refused) is logged; the batch's
    other scopes are folded and alerted, and the run names the failed scope's first record
    (``batchItemFailures``), from which Lambda delivers the batch again."""
    poisoned, healthy = (keys.scope_key(seed_org(), "app-1", "APP") for _ in range(2))
    put_shard(poisoned, "premium", 0, cost=5)
    put_shard(healthy, "premium", 0, cost=7)
    event = stream()
    real_fold = daily_totals.fold_scope

    def refuse_poisoned(scope, *args):
        if scope == poisoned:
            raise RuntimeError("ValidationException: Item size has exceeded the maximum allowed size")
        return real_fold(scope, *args)

    monkeypatch.setattr(daily_totals, "fold_scope", refuse_poisoned)
    (failure,) = fold(event)["batchItemFailures"]
    sequence_of = {
        r["dynamodb"]["Keys"]["shard_key"]["S"].split("#LABEL#")[0]: r["dynamodb"]["SequenceNumber"]
        for r in event["Records"]
    }
    assert failure == {"itemIdentifier": sequence_of[poisoned]}
    assert scope_total(healthy)["cost_usd_micros"] == 7 and scope_total(poisoned) is None
    monkeypatch.undo()
    resumed = [r for r in event["Records"] if int(r["dynamodb"]["SequenceNumber"]) >= int(sequence_of[poisoned])]
    assert fold({**event, "Records": resumed})["totals_written"] == 2  # Lambda's retry, from the failed record on
    assert scope_total(poisoned)["cost_usd_micros"] == 5


def test_a_stream_runs_reply_and_log_line_are_json(stream, caplog):
    """The run's summary counts the report's maps, whose keys are tuples. As they were, the
    Lambda runtime could not marshal the reply (``Runtime.MarshalError``: every invocation
    that folded something failed and was retried; the local gateway now encodes replies as
    the runtime does), and the logger could not serialise the line (the tests log warnings
    only, so none showed it; a review found both)."""
    from price_keeper.observability import logger

    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=5)
    with caplog.at_level("INFO", logger=logger.name):  # as deployed
        reply = fold(stream())
    assert json.loads(json.dumps(reply))["scope_costs"] == 1
    (record,) = [record for record in caplog.records if record.getMessage() == "aggregation run"]
    line = json.loads(logger.registered_formatter.format(record))
    assert line["report"]["totals_written"] == 2 and line["report"]["scope_costs"] == 1


def test_the_scheduled_handler_reports_the_run(api):
    tenant = new_tenant()
    api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token)
    report = load_handler("aggregator")({"source": "aws.events"}, LambdaContext("aggregator"))
    assert report["totals_written"] == 2 and report["active_shards"] == 1  # the label and the scope total
    assert total(tenant.scope, "premium", org_day("America/New_York"))["cost_usd_micros"] == 3760


# --- event-driven runs: the usage table's stream ---------------------------------------


@pytest.fixture
def stream(aws):
    """The usage table's stream as the aggregator's event source mapping delivers it:
    ``stream()`` is a Lambda event of the records written since the last call."""
    from local.streams import StreamReader

    return StreamReader(tables.USAGE_AGG_SHARDED).event


def fold(event: dict) -> dict:
    """The aggregator function, as the event source mapping invokes it, within its role."""
    from tests.iam_check import only_granted

    with only_granted("aggregator"):
        return load_handler("aggregator")(event, LambdaContext("aggregator"))


def scope_total(scope: str, day: str = DAY) -> dict | None:
    return (
        table(tables.DAILY_TOTAL)
        .get_item(Key={"usage_key": keys.scope_total_key(scope), "date_key": f"DAY#{day}"})
        .get("Item")
    )


def test_a_stream_batch_moves_only_the_scopes_it_names(stream, calls):
    seen, keys_read = calls
    other = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(other, "premium", 0, cost=500)
    stream()  # delivered earlier (here: never folded)
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 3, cost=250, requests=2)
    seen.clear()
    report = fold(stream())
    assert "Scan" not in seen and "Query" not in seen  # no discovery: the stream names the shards
    assert total(scope, "premium")["cost_usd_micros"] == 250 and spent_labels(scope) == {"premium"}
    assert total(other, "premium") is None and scope_total(other) is None
    assert all(other not in str(key) for key in keys_read)
    assert report["usage_keys"] == 1 and report["totals_written"] == 2  # the label and the scope total


def test_a_replayed_or_duplicated_batch_counts_once(stream, api):
    tenant = new_tenant()
    for _ in range(3):
        assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    event = stream()
    assert fold(event)["totals_written"] == 2
    assert fold(event)["totals_written"] == 0  # Lambda delivered the batch again: nothing to write
    assert fold({**event, "Records": event["Records"] * 2})["totals_written"] == 0  # a record twice in one batch
    day = org_day("America/New_York")
    premium = total(tenant.scope, "premium", day)
    assert (premium["requests"], premium["cost_usd_micros"]) == (3, 3 * 3760)
    assert scope_total(tenant.scope, day)["cost_usd_micros"] == 3 * 3760


def test_every_shard_of_the_scope_counts_whatever_shard_the_batch_names(stream):
    scope = keys.scope_key(seed_org(agg_shard_count=16), "app-1", "APP")
    put_shard(scope, "premium", 15, cost=40)
    stream()  # this batch was lost: the stream's retries ran out
    put_shard(scope, "premium", 2, cost=2)
    fold(stream())
    assert total(scope, "premium")["cost_usd_micros"] == 42  # the lost shard is summed all the same


def test_dedup_items_and_deletions_are_not_folded(stream, calls):
    seen, _ = calls
    tenant = new_tenant()
    put_shard(tenant.scope, "premium", 0)
    table(tables.USAGE_AGG_SHARDED).put_item(Item={"shard_key": f"{tenant.scope}#REQ#x", "date_key": "DEDUP"})
    table(tables.USAGE_AGG_SHARDED).delete_item(
        Key={"shard_key": keys.shard_key(tenant.scope, "premium", 0), "date_key": f"DAY#{DAY}"}
    )
    event = stream()
    records = event["Records"]
    assert [r["eventName"] for r in records] == ["INSERT", "INSERT", "REMOVE"]
    seen.clear()
    report = fold({**event, "Records": records[1:]})
    assert sum(seen.values()) == 0 and report["usage_keys"] == 0


def test_labels_folded_in_any_order_all_reach_the_scope_total(stream):
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=100)
    first = stream()
    put_shard(scope, "standard", 1, cost=20)
    put_shard(scope, "my-profile", 1, cost=3)  # outside the ordering
    second = stream()
    fold(second)  # the later batch lands first (another stream shard)
    fold(first)
    assert (scope_total(scope)["cost_usd_micros"], spent_labels(scope)) == (
        123,
        {"premium", "standard", "my-profile"},
    )


def test_a_scope_total_never_forgets_a_label(stream, monkeypatch):
    """Label sets only grow: a total written from a partial view (here a sweep whose index
    read missed a shard) never drops a label, or later runs would stop reading its total."""
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=100)
    put_shard(scope, "standard", 1, cost=20)
    fold(stream())
    put_shard(scope, "standard", 1, cost=50, requests=5)
    stream()  # lost
    found = usage.active_shard_keys
    monkeypatch.setattr(
        usage, "active_shard_keys", lambda day: [key for key in found(day) if "#LABEL#premium#" not in key["shard_key"]]
    )
    aggregation.run(NOW)
    assert spent_labels(scope) == {"premium", "standard"}
    monkeypatch.undo()
    put_shard(scope, "standard", 2, cost=1)
    fold(stream())
    assert scope_total(scope)["cost_usd_micros"] == 151


def test_a_stream_batch_fires_the_alerts_its_totals_cross(stream, api):
    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    events = boto3.client("events")
    events.create_event_bus(Name=alerts.DEFAULT_EVENT_BUS)
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202  # 94 %
    event = stream()
    assert fold(event)["alerts_fired"] == 1  # THRESHOLD 80 %
    assert fold(event)["alerts_fired"] == 0  # delivered again: fired once


def test_spend_of_an_org_no_longer_registered_is_left_to_the_sweep(stream):
    """Its shard count is unknown, so the stream run cannot know every shard of its labels;
    failing the batch would only hold up the others' spend behind it."""
    gone = keys.scope_key(str(uuid.uuid4()), "app-1", "APP")
    put_shard(gone, "premium", 0, cost=7)
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=5)
    fold(stream())
    assert total(scope, "premium")["cost_usd_micros"] == 5 and total(gone, "premium") is None
    aggregation.run(NOW)
    assert total(gone, "premium")["cost_usd_micros"] == 7


# --- cost per changed label ------------------------------------------------------------


@pytest.mark.parametrize(
    "first_shard_count, shards_read",
    [(None, 8), (1, 1)],  # an org created before adaptive shards: all 8 of the org's; a new org's quiet label-day: 1
)
def test_a_lone_reports_fold_is_one_read_and_one_write(stream, api, calls, first_shard_count, shards_read):
    """Shards, totals and sticky state in one BatchGetItem; both totals in one transaction.
    (A container's first fold also reads the config and boosts and writes the heartbeat.)"""
    seen, keys_read = calls
    tenant = new_tenant(first_shard_count=first_shard_count)
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    fold(stream())
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    event = stream()
    seen.clear()
    keys_read.clear()
    consistency = {}
    ddb_client().meta.events.register(
        "before-parameter-build.dynamodb.BatchGetItem",
        lambda params, **_: consistency.update(
            {name: request["ConsistentRead"] for name, request in params["RequestItems"].items()}
        ),
    )
    report = fold(event)
    assert report["totals_written"] == 2
    assert dict(seen) == {"BatchGetItem": 1, "TransactWriteItems": 1}
    # the shards and the label-day's shard count; its total, the scope's, the ordering's 2 others; sticky
    assert len(keys_read) == shards_read + 1 + 1 + 1 + 2 + 1
    # the shards strongly consistent (the write that triggered the run must be seen); the totals
    # and sticky state at half the units (a stale total only fails the conditional write)
    assert consistency == {
        tables.USAGE_AGG_SHARDED.physical_name: True,
        tables.DAILY_TOTAL.physical_name: False,
        tables.STICKY_STATE.physical_name: False,
    }
    day = org_day("America/New_York")
    assert (total(tenant.scope, "premium", day)["requests"], scope_total(tenant.scope, day)["requests"]) == (2, 2)


def test_a_lone_reports_fold_where_config_labels_are_apart_writes_its_label_total_alone(stream, api, calls):
    """Where the scope total leaves the config labels apart (an org made now), a config
    label's fold writes its label total alone: one conditional UpdateItem (1 WCU), not a
    transaction with the scope total (4), its first too (nothing lists a config label: every
    reader reads them all). The read adds the config labels outside the ordering, whose
    totals are part of the scope's spend that alerts evaluate."""
    seen, keys_read = calls
    tenant = new_tenant()
    day = org_day("America/New_York")
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    fold(stream())  # the container's first: its config read, the heartbeat
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    event = stream()
    seen.clear()
    keys_read.clear()
    report = fold(event)
    assert report["totals_written"] == 1
    assert dict(seen) == {"BatchGetItem": 1, "UpdateItem": 1}
    # its shard and count item; its total, the scope's, the ordering's 2 others, ultra_premium; sticky
    assert len(keys_read) == 1 + 1 + 1 + 1 + 2 + 1 + 1
    assert total(tenant.scope, "premium", day)["requests"] == 2
    assert scope_total(tenant.scope, day) is None and usage_support.spent_labels(tenant.scope, day) == set()
    answer = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).json()
    assert answer["scope_total"]["spend_usd_micros"] == answer["daily_total"]["cost_usd_micros"] == 2 * 3760


@pytest.mark.parametrize("labels_apart", [False, True])
def test_every_reader_counts_every_label_in_the_scopes_spend(stream, api, labels_apart):
    """A label of the ordering, a config label outside it and any other label (a profile's):
    the scope's spend is their sum for the total cap in selection, the usage answer and
    aggregates, whether the scope total counts the config labels or leaves them apart."""
    tenant = new_tenant(labels_apart=labels_apart)
    day = org_day("America/New_York")
    spends = {"premium": 100, "ultra_premium": 20, "my-profile": 3}
    for label, cost in spends.items():
        usage_support.put_shard(tenant.scope, label, 0, day=day, updated_at=int(utc_now().timestamp()), cost=cost)
    fold(stream())
    assert scope_total(tenant.scope, day)["cost_usd_micros"] == (3 if labels_apart else 123)
    assert usage_support.spent_labels(tenant.scope, day) == ({"my-profile"} if labels_apart else set(spends))
    selection = api.get(tenant.app_path + "/model-selection", token=tenant.token).json()
    assert selection["quota_status"]["total"]["spend_usd_micros"] == 123
    aggregates = api.get(tenant.app_path + "/aggregates/today", token=tenant.token).json()
    assert aggregates["total_cost_usd_micros"] == 123
    # every label spent on is shown (a config label outside the ordering is not listed on the
    # scope total where it is apart; the profile's listing is found beside it)
    assert {label: aggregates["models"][label]["cost_usd_micros"] for label in spends} == spends
    on = f"{day[:4]}-{day[4:6]}-{day[6:]}"
    rows = api.get(
        f"/api/v1/orgs/{tenant.org_id}/reports/spend", token=tenant.org_token, query=f"from={on}&to={on}"
    ).json()
    assert {row["label"]: row["cost_usd_micros"] for row in rows["rows"]} == spends
    answer = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).json()
    assert answer["scope_total"]["spend_usd_micros"] == 123


@pytest.mark.parametrize("labels_apart", [False, True])
def test_a_label_removed_from_config_yaml_keeps_its_spend_in_the_scopes_spend(
    stream, api, monkeypatch, tmp_path, labels_apart
):
    """An operator retires a config.yaml label during a day it was spent on. Where config
    labels are apart, that spend is only in the label's own total: every reader still adds
    it (``orgs.config_labels_ever``: the aggregator stored the label before folding it), so
    the total cap and the hard cap still count it and the spend report still shows it."""
    tenant = new_tenant(labels_apart=labels_apart, model_ordering=("premium", "standard"))
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(tenant.org_id), "resource_key": keys.ROOT_RESOURCE},
        UpdateExpression="SET total_quota_usd_micros = :cap",
        ExpressionAttributeValues={":cap": 30_000},
    )
    day = org_day("America/New_York")
    now = int(utc_now().timestamp())
    usage_support.put_shard(tenant.scope, "ultra_premium", 0, day=day, updated_at=now, cost=20_000)
    fold(stream())

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


def test_where_config_labels_are_apart_the_total_caps_alerts_count_them(stream):
    """The fold's scope spend for alerts is its scope total's and every config label's: 80 %
    of the total cap spent on a config label outside the ordering fires its threshold."""
    tenant = new_tenant()  # total cap: the quotas' 17,000,000
    day = org_day("America/New_York")
    now = int(utc_now().timestamp())
    usage_support.put_shard(tenant.scope, "ultra_premium", 0, day=day, updated_at=now, cost=13_600_000)
    fold(stream())
    fired = alert_records.of_day(tenant.scope, day)
    assert [item["date_key"] for item in fired.values()] == [keys.alert_date_key(day, alerts.THRESHOLD, "-", "80")]
    assert scope_total(tenant.scope, day) is None  # the config label's spend is not in it


@pytest.mark.parametrize("labels", [20, pytest.param(100, marks=pytest.mark.slow)])  # 100: volume, make test
def test_a_batch_costs_at_most_two_calls_per_label_it_changed(stream, calls, labels):
    """The worst case: every label in a scope of its own (one transaction each)."""
    seen, _ = calls
    scopes = [keys.org_key(seed_org(quota_scope="ORG")) for _ in range(labels)]
    for scope in scopes:
        put_shard(scope, "premium", 0)
    fold(stream())  # the container's first: configs and boosts read, then cached
    for scope in scopes:
        put_shard(scope, "premium", 5, cost=30, requests=2)
    seen.clear()
    report = fold(stream())
    assert report["totals_written"] == 2 * labels
    assert seen["TransactWriteItems"] == labels and sum(seen.values()) <= 2 * labels
    assert all(scope_total(scope)["cost_usd_micros"] == 130 for scope in scopes)


def test_concurrent_folds_of_one_scope_keep_its_total_the_sum_of_its_labels(stream):
    """Runs on different labels of a scope (other stream shards) race for its total: a
    transaction that lost re-reads and folds again, and nothing is counted twice or lost."""
    import threading

    scope = keys.org_key(seed_org(quota_scope="ORG"))
    labels = [f"label-{n}" for n in range(6)]
    events = []
    for n, label in enumerate(labels):
        put_shard(scope, label, n % 8, cost=10 + n)
        events.append(stream())
    threads = [threading.Thread(target=fold, args=(event,)) for event in events * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert scope_total(scope)["cost_usd_micros"] == sum(10 + n for n in range(6))
    assert scope_total(scope)["requests"] == 6 and spent_labels(scope) == set(labels)


# --- hot labels: the shard count grows with the load -------------------------------------


@pytest.fixture
def conflicts_like_dynamodb(aws):
    """DynamoDB cancels a transaction that touches an item another transaction holds
    (``TransactionConflict``); moto serialises them instead. This hook answers as DynamoDB
    does: a TransactWriteItems whose shard is held by one in flight (sent, not yet answered)
    is cancelled. ``held["conflicts"]`` counts the cancellations."""
    import threading
    from types import SimpleNamespace

    lock, mine = threading.Lock(), threading.local()
    held: Counter = Counter()

    def remember(params, model, **_):
        if model.name == "TransactWriteItems":
            mine.keys = {
                json.dumps(action["Update"]["Key"], sort_keys=True)
                for action in params["TransactItems"]
                if "Update" in action
            }

    def enter(model, **_):
        if model.name != "TransactWriteItems":
            return None
        with lock:
            if any(held[key] for key in mine.keys):
                mine.keys = set()
                held["conflicts"] += 1
                return SimpleNamespace(status_code=400), {
                    "Error": {"Code": "TransactionCanceledException", "Message": "[None, TransactionConflict]"},
                    "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}],
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                }
            held.update(mine.keys)
        return None

    def leave(model, **_):
        if model.name == "TransactWriteItems":
            with lock:
                held.subtract(mine.keys)

    events = ddb_client().meta.events
    events.register("before-parameter-build.dynamodb", remember)
    events.register("before-call.dynamodb", enter)
    events.register("after-call.dynamodb", leave)
    return held


def submit_concurrently(tenant, requests: list, threads: int = 16) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    from price_keeper.domain import metering

    def submit(request):
        while True:  # as the client library does: a 503 is sent again, same request id
            try:
                return metering.submit(tenant.org_id, tenant.app_id, request)
            except ApiError as error:
                assert error.status == 503

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(submit, requests))


def shard_count_item(scope: str, label: str, day: str) -> dict | None:
    key = keys.shard_count_key(scope, label, keys.day_key(day))
    return table(tables.USAGE_AGG_SHARDED).get_item(Key=key, ConsistentRead=True).get("Item")


@pytest.mark.parametrize("first_shard_count", [None, 1])  # the org's 8 from the start; a new org's quiet start
def test_a_hot_label_spreads_over_more_shards_and_counts_every_record_once(
    stream, api, conflicts_like_dynamodb, first_shard_count
):
    from price_keeper.domain import hot_labels
    from price_keeper.domain.models import UsageRequest

    tenant = new_tenant(first_shard_count=first_shard_count)
    day = org_day("America/New_York")
    requests = [UsageRequest.model_validate(usage_body()) for _ in range(160)]
    answers = submit_concurrently(tenant, requests)
    assert conflicts_like_dynamodb["conflicts"] > 0
    raised = int(shard_count_item(tenant.scope, "premium", day)["shard_count"])
    start = first_shard_count or 8
    assert 8 <= raised <= 64 and raised > start  # a quiet label-day's first conflict spreads it to the org's 8
    used = {answer["processing"]["shard_id"] for answer in answers}
    assert max(used) >= start  # records went to the new shards
    fold(stream())
    assert total(tenant.scope, "premium", day)["requests"] == 160
    assert total(tenant.scope, "premium", day)["cost_usd_micros"] == 160 * 3760
    assert scope_total(tenant.scope, day)["requests"] == 160
    # exactly once across the change: a retry of each record, from a container that never
    # learned the raise, is a duplicate answered with the shard it went to
    hot_labels._known.clear()
    again = submit_concurrently(tenant, requests)
    assert all(answer["duplicate"] for answer in again)
    assert [a["processing"]["shard_id"] for a in again] == [a["processing"]["shard_id"] for a in answers]
    fold(stream())
    assert total(tenant.scope, "premium", day)["requests"] == 160


def test_the_shard_count_stops_at_64_and_folds_read_every_shard_across_raises(stream):
    from price_keeper.domain import hot_labels

    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 3, cost=1)
    fold(stream())
    count = 8
    while count < hot_labels.MAX_SHARDS:
        count = hot_labels.raise_after_conflict(scope, "premium", DAY, count, 8, 2_000_000_000)
    assert count == 64 and hot_labels.raise_after_conflict(scope, "premium", DAY, 64, 8, 2_000_000_000) == 64
    assert shard_count_item(scope, "premium", DAY)["shard_count"] == 64
    put_shard(scope, "premium", 63, cost=10)  # this batch is lost
    stream()
    hot_labels._known.clear()  # another container: it knows only the org's 8
    put_shard(scope, "premium", 5, cost=100)
    fold(stream())  # names shard 5 only; the count item says 64
    assert total(scope, "premium")["cost_usd_micros"] == 111 and scope_total(scope)["cost_usd_micros"] == 111


def test_a_quiet_label_days_first_conflict_spreads_it_to_the_orgs_count_then_doubles(stream):
    from price_keeper.domain import hot_labels

    scope = keys.scope_key(seed_org(agg_shard_count=16), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=1)
    fold(stream())
    assert total(scope, "premium")["cost_usd_micros"] == 1
    assert hot_labels.raise_after_conflict(scope, "premium", DAY, 1, 16, 2_000_000_000) == 16  # not 2
    assert hot_labels.raise_after_conflict(scope, "premium", DAY, 16, 16, 2_000_000_000) == 32
    put_shard(scope, "premium", 31, cost=10)
    hot_labels._known.clear()  # another container: it knows only that the org starts on one shard
    put_shard(
        scope, "premium", 0, cost=101, requests=2
    )  # its second record, from a writer that never learned the raise
    fold(stream())  # names shards 31 and 0; the count item says 32
    assert total(scope, "premium")["cost_usd_micros"] == 111 and scope_total(scope)["cost_usd_micros"] == 111
    assert total(scope, "premium")["requests"] == 3


def test_an_older_org_starts_its_label_days_on_one_shard_from_the_configured_day(stream, monkeypatch):
    """config.yaml's ``metering.one_shard_from`` moves orgs made before adaptive shards: their
    label-days before that day stay on all of their shards, and the folds read them so."""
    import dataclasses

    from price_keeper.domain import orgs

    real = orgs.get_config()
    moved = dataclasses.replace(real, metering=real.metering._replace(one_shard_from=DAY))
    monkeypatch.setattr(orgs, "get_config", lambda: moved)
    org_id = seed_org(quota_scope="ORG")  # no first_shard_count on its item
    config = orgs.effective_config(org_id)
    assert [config.starting_shards(day) for day in ("20260122", DAY, "20260124")] == [8, 1, 1]
    scope = keys.org_key(org_id)
    put_shard(scope, "premium", 5, day="20260122", cost=7)  # the day before: written over 8 shards
    put_shard(scope, "premium", 0, day=DAY, cost=11)  # from the day: on its one shard
    fold(stream())
    assert total(scope, "premium", "20260122")["cost_usd_micros"] == 7
    assert total(scope, "premium", DAY)["cost_usd_micros"] == 11


def test_an_older_org_keeps_config_labels_apart_from_the_configured_day(stream, monkeypatch):
    """config.yaml's ``metering.config_labels_apart_from`` moves orgs made before: their scope
    totals of the days before still count every label, those from the day leave config
    labels apart, and a fold of either day keeps to its day's layout."""
    import dataclasses

    from price_keeper.domain import orgs

    real = orgs.get_config()
    moved = dataclasses.replace(real, metering=real.metering._replace(config_labels_apart_from=DAY))
    monkeypatch.setattr(orgs, "get_config", lambda: moved)
    scope = keys.org_key(seed_org(quota_scope="ORG"))  # no config_labels_apart on its item
    for day in ("20260122", DAY):
        put_shard(scope, "premium", 0, day=day, cost=7)
        put_shard(scope, "my-profile", 0, day=day, cost=2)
    fold(stream())
    assert scope_total(scope, "20260122")["cost_usd_micros"] == 9  # every label
    assert scope_total(scope, DAY)["cost_usd_micros"] == 2  # the profile's alone
    assert total(scope, "premium", DAY)["cost_usd_micros"] == 7


def test_live_spend_in_tight_mode_counts_the_shards_of_a_raised_count(aws):
    from price_keeper.domain import hot_labels

    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 1, cost=5)
    hot_labels.raise_after_conflict(scope, "premium", DAY, 8, 8, 2_000_000_000)
    put_shard(scope, "premium", 12, cost=50)
    assert usage.label_spends(scope, ["premium", "standard"], DAY, 8) == {"premium": 55, "standard": 0}


# --- repair: the failure destination and the audit, fanned out over SQS ------------------


@pytest.fixture
def repair_queue(aws, monkeypatch):
    """The repair queue on moto's SQS, as the local stack runs it (``local.streams``);
    ``drain()`` delivers its messages to the aggregator (within its role) as the queue's
    event source mapping does, 10 at a time, until none is left; the invocations made."""
    import threading

    from local.streams import RepairQueue, RepairTrigger
    from tests.iam_check import only_granted

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


@pytest.mark.parametrize("chunk", [10, pytest.param(repair.AUDIT_CHUNK, marks=pytest.mark.slow)])
def test_the_audit_fans_out_over_the_repair_queue_in_chunks(repair_queue, calls, monkeypatch, chunk):
    """2.6 chunks of label-days: 3 messages. Chunks of 10 in every run; the deployed 100
    (260 label-days, ~13 s on moto) in ``make test``."""
    monkeypatch.setattr(repair, "AUDIT_CHUNK", chunk)
    seen, _ = calls
    today = utc_now().strftime("%Y%m%d")
    yesterday = (utc_now() - timedelta(days=1)).strftime("%Y%m%d")  # still open somewhere
    scopes = [keys.scope_key(seed_org(), "app-1", "APP") for _ in range(chunk * 13 // 10)]
    for n, scope in enumerate(scopes):
        put_shard(scope, "premium", n % 8, day=today, cost=n)
        put_shard(scope, "standard", 0, day=yesterday, cost=1)
    seen.clear()
    planned = fold({"source": "aws.events"})  # the schedule: only the plan
    assert (planned["label_days"], planned["messages"]) == (2 * len(scopes), 3)
    assert set(seen) == {"Query", "PutItem"}  # the index, one page a day here; the heartbeat
    seen.clear()
    assert repair_queue() == 1  # 3 messages, one invocation of up to 10
    assert seen["TransactWriteItems"] == 2 * len(scopes)  # a scope-day's label and total each
    assert all(scope_total(scope, today)["cost_usd_micros"] == n for n, scope in enumerate(scopes))
    assert all(scope_total(scope, yesterday)["cost_usd_micros"] == 1 for scope in scopes)
    assert fold({"source": "aws.events"})["messages"] == 3
    seen.clear()
    repair_queue()
    assert "TransactWriteItems" not in seen  # nothing new: the audit only reads


def test_the_audit_sends_each_batch_of_messages_within_sqs_limits(repair_queue, monkeypatch):
    """Chunks of hot label-days (64 shards) of the longest ids are ~45 KB a message: a
    SendMessageBatch carries at most 256 KiB of them (and 10), and every chunk is enqueued."""
    from price_keeper.aws import client

    org_id, app_id = str(uuid.uuid4()), "a" * 64
    scope = keys.scope_key(org_id, app_id, "APP")
    label_days = {
        (keys.usage_key(scope, f"{n:03d}".ljust(64, "x")), keys.day_key(DAY)): keys.shard_item_keys(
            scope, f"{n:03d}".ljust(64, "x"), keys.day_key(DAY), 64
        )
        for n in range(2_000)
    }
    monkeypatch.setattr(aggregation, "active_label_shards", lambda day: label_days if day == DAY else {})
    sizes = []

    def measure(params, **_):
        sizes.append((len(params["Entries"]), sum(len(entry["MessageBody"].encode()) for entry in params["Entries"])))

    client("sqs").meta.events.register("provide-client-params.sqs.SendMessageBatch", measure)
    planned = repair.plan_audit(NOW)
    assert planned["messages"] == 20
    assert all(count <= 10 and size <= 256 * 1024 for count, size in sizes) and len(sizes) > 2
    assert sum(count for count, _ in sizes) == 20 and max(size for _, size in sizes) > 200 * 1024


def test_a_stream_batch_resumes_at_the_first_record_of_a_scope_day_whose_fold_failed(stream, repair_queue, monkeypatch):
    """Two scopes in one stream batch, the second's fold failing: the aggregator folds the
    first and names the second's first record (``batchItemFailures``), where the mapping
    delivers the batch again; the local trigger does so, and the retry folds the rest."""
    import threading

    import local.streams
    from local.streams import StreamReader, StreamTrigger
    from tests.test_faults import fail_calls

    monkeypatch.setattr(aggregation, "FOLD_THREADS", 1)  # the first scope's write succeeds, the second's fails
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    folded, failing = sorted(keys.scope_key(seed_org(), "app-1", "APP") for _ in range(2))
    for scope in (folded, failing):
        put_shard(scope, "premium", 0, cost=5)
    event = reader.event()
    batch = event["Records"]
    first_of_failing = next(
        r["dynamodb"]["SequenceNumber"] for r in batch if r["dynamodb"]["Keys"]["shard_key"]["S"].startswith(failing)
    )
    fail_calls("TransactWriteItems", 1, code="InternalServerError", after=1)
    reply = fold(event)
    assert reply == {"state": {}, "batchItemFailures": [{"itemIdentifier": first_of_failing}]}
    assert total(folded, "premium")["cost_usd_micros"] == 5 and total(failing, "premium") is None

    delivered = []
    invoke = local.streams.invoke_job
    monkeypatch.setattr(local.streams, "invoke_job", lambda name, event: delivered.append(event) or invoke(name, event))
    fail_calls("TransactWriteItems", 1, code="InternalServerError")  # the first delivery's fold of the failing scope
    assert StreamTrigger("aggregator", reader, threading.Event())._deliver(event["shardId"], batch)
    resumed = [r["dynamodb"]["SequenceNumber"] for r in delivered[1]["Records"]]
    assert resumed[0] == first_of_failing and len(resumed) < len(batch)
    assert total(failing, "premium")["cost_usd_micros"] == 5


def test_the_local_trigger_delivers_a_failing_batch_again_until_it_is_folded(monkeypatch):
    """As the mapping does with no retry limit: a batch failing more often than the 10
    retries it once had is not given up (a skipped batch would leave records the ledger's
    shard progress has moved past), and each delivery names the batch's shard."""
    import threading

    import local.streams
    from local.streams import StreamTrigger

    class NoWaiting(threading.Event):
        def wait(self, timeout=None):
            return False

    batch = [{"dynamodb": {"SequenceNumber": number}} for number in ("100", "200", "300")]
    delivered = []
    replies = iter([{"batchItemFailures": [{"itemIdentifier": "200"}]}] * 12 + [{}])
    monkeypatch.setattr(
        local.streams,
        "invoke_job",
        lambda name, event: (
            delivered.append((event["shardId"], [r["dynamodb"]["SequenceNumber"] for r in event["Records"]]))
            or next(replies)
        ),
    )
    assert StreamTrigger("aggregator", None, NoWaiting())._deliver("shard-1", batch)
    assert delivered == [("shard-1", ["100", "200", "300"])] + [("shard-1", ["200", "300"])] * 12


def test_a_repair_message_whose_fold_fails_comes_back_alone(repair_queue, monkeypatch):
    """Two audit messages in one delivery, one naming a scope whose fold keeps failing: the
    aggregator reports that message (``batchItemFailures``), so SQS delivers it again (and,
    at last, to the dead-letter queue) while the other, folded, is deleted; before, the
    run raised and both came back, the folded one to the dead-letter queue too."""
    import local.streams
    from tests.test_faults import FOREVER, fail_calls

    monkeypatch.setattr(aggregation, "FOLD_THREADS", 1)  # the first scope's write succeeds, the second's fails
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    replies = []
    invoke = local.streams.invoke_job
    monkeypatch.setattr(local.streams, "invoke_job", lambda *args: replies.append(invoke(*args)) or replies[-1])
    folded, failing = sorted(keys.scope_key(seed_org(), "app-1", "APP") for _ in range(2))
    sqs, url = repair_queue.queue.sqs, repair_queue.queue.url
    sent = {}
    for scope in (folded, failing):
        put_shard(scope, "premium", 0, cost=5)
        body = {"audit": [[keys.usage_key(scope, "premium"), keys.day_key(DAY), [0]]]}
        sent[scope] = sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))["MessageId"]
    fail_calls("TransactWriteItems", FOREVER, code="InternalServerError", after=1)
    assert repair_queue() == 1
    assert total(folded, "premium")["cost_usd_micros"] == 5 and total(failing, "premium") is None
    assert replies == [{"batchItemFailures": [{"itemIdentifier": sent[failing]}]}]
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (left["ApproximateNumberOfMessages"], left["ApproximateNumberOfMessagesNotVisible"]) == ("0", "1")


def test_an_unreadable_repair_message_comes_back_alone_and_the_others_are_folded(aws):
    """A repair delivery with an audit chunk, a message that is no audit chunk and a
    malformed body: the audit chunk is folded and only the other two are named failed
    (red-team note: an unreadable message raised out of the worker, so the whole delivery
    came back and, after its receives, went to the dead-letter queue, folded chunks too)."""
    from price_keeper.domain import repair

    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=5)
    gone = {
        "streamArn": "arn:aws:dynamodb:us-east-1:123456789012:table/old-usage/stream/2020-01-01T00:00:00.000",
        "shardId": "shardId-00000001700000000000-abcdef12",
        "startSequenceNumber": "100000000000000000001",
        "endSequenceNumber": "100000000000000000009",
        "batchSize": 1,
    }
    repaired = repair.repair(
        {
            "audit": json.dumps({"audit": [[keys.usage_key(scope, "premium"), keys.day_key(DAY), [0]]]}),
            "gone stream": json.dumps(
                {"requestContext": {"condition": "RetryAttemptsExhausted"}, "DDBStreamBatchInfo": gone}
            ),
            "malformed": "{not json",
        }
    )
    assert repaired.failed_messages == ["gone stream", "malformed"]
    assert total(scope, "premium")["cost_usd_micros"] == 5


def test_the_aggregator_names_an_unreadable_repair_message_so_it_comes_back(repair_queue, monkeypatch):
    """Through the handler and the queue: the reply names the malformed message although no
    fold failed (before, the handler named messages only when a fold failed, and deleted it)."""
    import local.streams

    replies = []
    invoke = local.streams.invoke_job
    monkeypatch.setattr(local.streams, "invoke_job", lambda *args: replies.append(invoke(*args)) or replies[-1])
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    put_shard(scope, "premium", 0, cost=5)
    sqs, url = repair_queue.queue.sqs, repair_queue.queue.url
    body = {"audit": [[keys.usage_key(scope, "premium"), keys.day_key(DAY), [0]]]}
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    malformed = sqs.send_message(QueueUrl=url, MessageBody="{not json")["MessageId"]
    assert repair_queue() == 1
    assert total(scope, "premium")["cost_usd_micros"] == 5
    assert replies == [{"batchItemFailures": [{"itemIdentifier": malformed}]}]
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (left["ApproximateNumberOfMessages"], left["ApproximateNumberOfMessagesNotVisible"]) == ("0", "1")


# --- bounded growth ----------------------------------------------------------------------


@pytest.mark.parametrize("fold_by", [pytest.param("stream", marks=pytest.mark.slow), "audit"])  # volume: make test
def test_a_scope_of_many_labels_folds_in_transactions_that_fit_and_its_total_stays_small(stream, calls, fold_by):
    """150 labels of one scope changed at once (an app of many profiles): more than one
    TransactWriteItems takes (100 actions at most), every label and the scope total are
    exact, each label is listed once, and the scope total holds no list that grows."""
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    for n in range(150):
        put_shard(scope, f"profile-{n:03d}", 0, cost=10)
    seen, _ = calls
    seen.clear()
    fold(stream()) if fold_by == "stream" else aggregation.run(NOW)
    assert seen["TransactWriteItems"] == 4  # 150 first folds: a total and a listing each, 49 a transaction
    assert [total(scope, f"profile-{n:03d}")["cost_usd_micros"] for n in (0, 99, 149)] == [10, 10, 10]
    stored = scope_total(scope)
    assert (stored["cost_usd_micros"], stored["requests"]) == (1500, 150) and "labels" not in stored
    assert dynamo.item_size(stored) < 512
    assert spent_labels(scope) == {f"profile-{n:03d}" for n in range(150)}
    for n in range(150):
        put_shard(scope, f"profile-{n:03d}", 1, cost=1)
    seen.clear()
    fold(stream()) if fold_by == "stream" else aggregation.run(NOW)
    assert seen["TransactWriteItems"] == 2  # no listing again: 99 totals a transaction
    assert (scope_total(scope)["cost_usd_micros"], len(spent_labels(scope))) == (1650, 150)


def test_a_scope_day_whose_second_transaction_loses_a_race_folds_the_rest_once(aws, monkeypatch):
    """The first of a scope-day's transactions commits, the second finds its totals moved
    (here: refused once): the retry re-reads and folds only what is left, and the report
    names every label moved, for alerts."""
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    for n in range(150):
        put_shard(scope, f"profile-{n:03d}", 0, cost=10)
    real_fold, calls = daily_totals.fold_scope, []

    def second_loses(*args):
        calls.append(len(args[2]))
        return False if len(calls) == 2 else real_fold(*args)

    monkeypatch.setattr(daily_totals, "fold_scope", second_loses)
    report = aggregation.run(NOW)
    # 49 first folds a transaction (with their listings): 49 committed, 49 refused; the retry: the 101 left
    assert calls == [49, 49, 49, 49, 3]
    stored = scope_total(scope)
    assert (stored["cost_usd_micros"], stored["requests"], stored["labels_listed"]) == (1500, 150, 150)
    assert len(spent_labels(scope)) == 150 and len({usage_key for usage_key, _ in report.changed}) == 150


def test_a_reader_lists_at_most_400_labels_of_a_scope(aws, monkeypatch):
    monkeypatch.setattr(daily_totals, "MAX_LISTED_LABELS", 5)  # 400 deployed: the same code path
    scope = keys.scope_key(seed_org(), "app-1", "APP")
    with table(tables.DAILY_TOTAL).batch_writer() as batch:
        for n in range(8):
            batch.put_item(Item=keys.spent_label_key(scope, f"DAY#{DAY}", f"profile-{n}"))
    assert spent_labels(scope) == {f"profile-{n}" for n in range(5)}


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
