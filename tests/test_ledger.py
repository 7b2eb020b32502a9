"""The ledger: a record is its dedup marker alone, and the aggregator folds the usage
stream's images of the markers into the totals exactly once, however the event source
mapping delivers a batch again; what a fold reads and writes, and what its handler replies,
logs and fires."""

from __future__ import annotations

import json
import threading
import uuid

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local.gateway import LambdaContext, load_handler
from price_keeper import bodies
from price_keeper.aws import events as alert_events
from price_keeper.bodies import UsageRequest
from price_keeper.config import get_config
from price_keeper.domain import aggregation, ledger, metering, orgs, voids
from price_keeper.store import daily_totals, dynamo, keys, tables, usage
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_day, utc_now
from tests.conftest import keys_asked
from tests.factories import seed_profiles
from tests.iam_check import only_granted
from tests.test_alerts import bus  # noqa: F401 - the fixture: the service bus delivering to a queue
from tests.test_profiles import bedrock  # noqa: F401 - the fixture: Bedrock's stand-in
from tests.usage_support import new_tenant, spent_labels, usage_body

LABELS = ("premium", "standard", "economy")
# A system inference profile an app registers its own labels for (priced as Nova Pro).
PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"


SHARD = "shardId-00000001700000000000-0000000a"  # the stream shard the tests' batches come from


@pytest.fixture
def stream(aws):
    """The usage stream's records written since the last call, as Lambda delivers them."""
    from local.streams import StreamReader

    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    return lambda: reader.event()["Records"]


def deliver(records: list[dict], shard_id: str = SHARD) -> dict:
    """The aggregator, as the event source mapping invokes it with a shard's batch, within its role."""
    from local.streams import lambda_event

    with only_granted("aggregator"):
        return load_handler("aggregator")(lambda_event(records, shard_id), LambdaContext("aggregator"))


def submit(tenant, label: str = "premium", request_id: str | None = None, **fields) -> dict:
    """A record of ``label`` through metering (a label config.yaml does not name is one of
    the app's profiles, ``with_profiles``)."""
    if label not in get_config().labels:
        fields.setdefault("calling_region", "us-east-1")
    body = usage_body(request_id=request_id, model_label=label, **fields)
    return metering.submit(tenant.org_id, tenant.app_id, UsageRequest.model_validate(body))


def with_profiles(tenant, labels) -> list[str]:
    """``labels`` registered as the tenant's app's profiles: labels the scope total counts."""
    seed_profiles(tenant.org_id, tenant.app_id, labels, PROFILE_ARN)
    return list(labels)


def label_total(scope: str, label: str) -> dict:
    day = keys.day_key(org_day("America/New_York"))
    key = {"usage_key": keys.usage_key(scope, label), "date_key": day}
    return table(tables.DAILY_TOTAL).get_item(Key=key).get("Item") or {}


def scope_total(scope: str) -> dict:
    day = keys.day_key(org_day("America/New_York"))
    return (
        table(tables.DAILY_TOTAL).get_item(Key={"usage_key": keys.scope_total_key(scope), "date_key": day}).get("Item")
        or {}
    )


def totals_of(scope: str, labels=LABELS) -> dict[str, tuple[int, int]]:
    return {
        label: (int(found.get("cost_usd_micros", 0)), int(found.get("requests", 0)))
        for label in labels
        if (found := label_total(scope, label))
    }


def expected(receipts: list[dict]) -> dict[str, tuple[int, int]]:
    sums: dict[str, list[int]] = {}
    for receipt in receipts:
        label = receipt["daily_total"]["label"]
        sums.setdefault(label, [0, 0])
        sums[label][0] += receipt["processing"]["cost_usd_micros"]
        sums[label][1] += 1
    return {label: tuple(value) for label, value in sums.items()}


def cost(receipts: list[dict]) -> int:
    return sum(receipt["processing"]["cost_usd_micros"] for receipt in receipts)


def operations(calls: list[tuple[str, dict]]) -> dict[str, int]:
    """How many of each DynamoDB operation ``calls`` (``dynamodb_calls``) made."""
    counted: dict[str, int] = {}
    for operation, _ in calls:
        counted[operation] = counted.get(operation, 0) + 1
    return counted


def markers(batch: list[dict]) -> list[dict]:
    """The ledger's records of a stream batch (not the index entries of its first records)."""
    return [record for record in batch if keys.is_marker(record["dynamodb"]["Keys"]["date_key"]["S"])]


def _records(batch: list[dict]):
    from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

    return list(DynamoDBStreamEvent({"Records": batch}).records)


# --- the record: its marker ----------------------------------------------------------------


def test_a_ledger_record_is_its_marker_alone_in_one_put(stream, dynamodb_calls):
    """Once its label-day has a total; before (the fold's lag), its records also list the
    day's spend in the ``active-by-day`` index, which a timezone change checks."""
    tenant = new_tenant()
    day = org_day("America/New_York")
    dynamodb_calls.clear()
    with only_granted("usage"):
        listing = submit(tenant)
    writes = [(op, params) for op, params in dynamodb_calls if op in ("PutItem", "TransactWriteItems")]
    assert [(op, len(params.get("TransactItems", ()))) for op, params in writes] == [("TransactWriteItems", 2)]
    assert usage.org_has_spend(tenant.org_id, day)  # before any fold
    entry = table(tables.USAGE_AGG_SHARDED).get_item(Key=keys.day_entry_key(tenant.scope, "premium", day))["Item"]
    assert entry["active_day"] == keys.active_day_key(day, tenant.org_id) and "requests" not in entry  # no counters
    deliver(stream())
    dynamodb_calls.clear()
    with only_granted("usage"):
        first = submit(tenant)
    writes = [(op, params.get("TableName")) for op, params in dynamodb_calls if op in ("PutItem", "TransactWriteItems")]
    assert writes == [("PutItem", tables.USAGE_AGG_SHARDED.physical_name)]  # 1 write unit, not the transaction's 4
    assert listing["duplicate"] is False
    marker = usage.read_marker(keys.marker_key(tenant.org_id, tenant.app_id, first["request_id"], 8))
    assert marker["cost_usd_micros"] == first["processing"]["cost_usd_micros"] and marker["scopes"] == [tenant.scope]
    again = submit(tenant, request_id=first["request_id"])
    assert again["duplicate"] is True
    assert again["processing"]["cost_usd_micros"] == first["processing"]["cost_usd_micros"]


def test_a_batchs_ledger_records_are_a_put_each_and_its_repeats_duplicates(stream, dynamodb_calls):
    tenant = new_tenant()
    counted_before, *_ = [submit(tenant, label) for label in LABELS]  # each label-day has its total
    deliver(stream())
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    bodies = [usage_body(model_label=label) for label in LABELS]
    dynamodb_calls.clear()
    with only_granted("usage_batch"):
        reply = metering.submit_batch(
            config.org_id, config.app_id, [*bodies, usage_body(request_id=counted_before["request_id"])]
        )
    writes = [op for op, _ in dynamodb_calls if op in ("PutItem", "TransactWriteItems")]
    assert writes == ["PutItem"] * 4  # the three records and the request id counted before
    assert [result["duplicate"] for result in reply["results"]] == [False, False, False, True]
    deliver(stream())
    assert sum(requests for _, requests in totals_of(tenant.scope).values()) == 6


# --- the fold: what a batch moves ------------------------------------------------------------


def test_a_batch_folds_into_label_totals_and_the_scope_total_of_its_other_labels(stream):
    """Each label-day's total holds its records' sums; the scope total holds those of the
    labels config.yaml does not name (a profile's), listed once, and leaves the config
    labels apart (their totals are read beside it: ``aggregation.scope_usage_keys``)."""
    tenant, other = new_tenant(), new_tenant()
    with_profiles(tenant, ["my-profile"])
    premium = [submit(tenant), submit(tenant, input_tokens=3000)]
    standard, profile = submit(tenant, "standard"), submit(tenant, "my-profile", input_tokens=500)
    others = [submit(other)]
    now = utc_now().replace(microsecond=0)
    report, resume = ledger.fold_batch(_records(stream()), SHARD, now)
    assert resume is None and report.totals_written == 4  # 3 label-days of one scope, 1 of the other
    found = label_total(tenant.scope, "premium")
    assert (found["cost_usd_micros"], found["requests"], found["input_tokens"], found["output_tokens"]) == (
        cost(premium),
        2,
        4500,
        1600,
    )
    assert totals_of(tenant.scope, ["premium", "standard", "my-profile"]) == expected([*premium, standard, profile])
    assert totals_of(other.scope) == expected(others)
    assert found["updated_at_epoch"] == int(now.timestamp())
    assert found["expires_at_epoch"] == aggregation.usage_expires_at(org_day("America/New_York"))
    stored = scope_total(tenant.scope)
    assert (stored["cost_usd_micros"], stored["requests"]) == (cost([profile]), 1)
    assert spent_labels(tenant.scope, org_day("America/New_York")) == {"my-profile"}
    assert scope_total(other.scope) == {}  # premium alone: apart


def test_the_stream_folds_ledger_records_into_their_totals_once_however_often_delivered(stream):
    tenant = new_tenant()
    receipts = [submit(tenant, label) for label in ("premium", "premium", "standard")]
    batch = stream()
    assert deliver(batch)["totals_written"] == 2
    assert totals_of(tenant.scope) == expected(receipts)
    assert deliver(batch)["totals_written"] == 0  # delivered again: every chunk was written
    assert deliver(batch + batch)["totals_written"] == 0  # and again, twice over: all before the shard's progress
    assert totals_of(tenant.scope) == expected(receipts)
    assert usage.org_has_spend(tenant.org_id, org_day("America/New_York"))  # its label-days are indexed
    receipts.append(submit(tenant))
    assert deliver(stream())["totals_written"] == 1  # a new record moves its label total alone
    assert totals_of(tenant.scope) == expected(receipts)


def test_an_org_scoped_record_of_a_capped_app_counts_in_the_org_and_in_its_app(stream):
    tenant = new_tenant(quota_scope="ORG", app_overrides={"app_daily_cap_usd_micros": 10**9})
    receipt = submit(tenant)
    deliver(stream())
    app_scope = orgs.effective_config(tenant.org_id, tenant.app_id).app_counter
    assert totals_of(tenant.scope) == totals_of(app_scope) == expected([receipt])


def test_a_stream_batch_moves_only_the_scopes_it_names(stream, dynamodb_calls):
    """No discovery: the batch's records name the label-days it reads and writes."""
    other, tenant = new_tenant(), new_tenant()
    submit(other)
    stream()  # delivered earlier (here: never folded)
    receipt = submit(tenant)
    batch = stream()
    dynamodb_calls.clear()
    assert deliver(batch)["totals_written"] == 1
    calls = list(dynamodb_calls)
    assert not {"Scan", "Query"} & set(operations(calls))
    assert all(other.org_id not in json.dumps(params, default=str) for _, params in calls)
    assert totals_of(tenant.scope) == expected([receipt]) and label_total(other.scope, "premium") == {}


def test_other_items_changes_and_ttl_removals_fold_nothing_and_read_nothing(stream, dynamodb_calls):
    """A batch of a label-day's index entry (put by its first record, updated by its first
    fold) and of a marker the TTL removed, no marker inserted or updated, makes no call at
    all: no progress read, no totals."""
    tenant = new_tenant()
    receipt = submit(tenant)  # its marker and the label-day's index entry
    first = stream()
    deliver(first)
    table(tables.USAGE_AGG_SHARDED).delete_item(  # as the TTL ends a marker
        Key=keys.marker_key(tenant.org_id, tenant.app_id, receipt["request_id"], 8)
    )
    others = [record for record in first + stream() if record not in markers(first)]
    assert {record["eventName"] for record in others} == {"INSERT", "MODIFY", "REMOVE"}
    dynamodb_calls.clear()
    assert deliver(others, "shardId-other")["totals_written"] == 0
    assert dynamodb_calls == []
    assert totals_of(tenant.scope) == expected([receipt])


def test_labels_folded_in_any_order_all_reach_the_scope_total(stream):
    """Batches of one scope's labels from two stream shards, the later one folded first."""
    tenant = new_tenant()
    labels = with_profiles(tenant, ["profile-a", "profile-b", "my-profile"])
    receipts = [submit(tenant, labels[0])]
    first = stream()
    receipts += [submit(tenant, label) for label in labels[1:]]
    second = stream()
    deliver(second, "shardId-b")
    deliver(first, "shardId-a")
    stored = scope_total(tenant.scope)
    assert (stored["cost_usd_micros"], stored["requests"]) == (cost(receipts), 3)
    assert spent_labels(tenant.scope, org_day("America/New_York")) == set(labels)


def test_a_void_folds_back_what_the_record_counted_and_a_ttl_removal_nothing(stream):
    tenant = new_tenant()
    kept, voided = submit(tenant), submit(tenant)
    deliver(stream())
    result = voids.void(
        tenant.org_id, bodies.VoidRequest(app_id=tenant.app_id, request_ids=[voided["request_id"]], reason="test")
    )
    assert result["voided"] == 1
    deliver(stream())
    total = label_total(tenant.scope, "premium")
    assert (int(total["cost_usd_micros"]), int(total["requests"]), int(total[usage.VOIDS])) == (
        kept["processing"]["cost_usd_micros"],
        1,
        1,
    )
    table(tables.USAGE_AGG_SHARDED).delete_item(  # as the TTL ends a marker
        Key=keys.marker_key(tenant.org_id, tenant.app_id, kept["request_id"], 8)
    )
    deliver(stream())
    assert int(label_total(tenant.scope, "premium")["cost_usd_micros"]) == kept["processing"]["cost_usd_micros"]


def test_a_repriced_ledger_record_folds_its_correction(stream, api, bedrock, bus):  # noqa: F811
    from price_keeper.domain import pricing
    from price_keeper.timeutil import parse_day
    from tests.test_pricing import put_price
    from tests.test_profiles import register
    from tests.test_unpriced_models import LLAMA, LLAMA_US, report

    tenant = new_tenant()
    assert register(api, tenant, "llama", arn=LLAMA_US).status == 201
    reply = report(api, tenant, "llama", input_tokens=1000, output_tokens=1000).json()
    deliver(stream())
    estimated = label_total(tenant.scope, "llama")
    assert int(estimated["cost_usd_micros"]) == reply["processing"]["cost_usd_micros"] > 1440
    put_price(LLAMA, f"{parse_day(reply['daily_total']['org_day']).isoformat()}#us-east-1", 720_000, 720_000)
    pricing._stored.clear()
    with only_granted("pricing_fetcher"):
        assert pricing.reprice_estimates([LLAMA]) == 1
    deliver(stream())
    total = label_total(tenant.scope, "llama")
    assert (int(total["cost_usd_micros"]), int(total["requests"]), int(total[usage.CORRECTIONS])) == (1440, 1, 1)


def test_a_record_of_an_org_no_longer_registered_never_holds_up_the_batch(stream):
    """An org deleted between its record and the fold: no config to evaluate alerts with,
    but the batch is folded, the other scopes' records and its own."""
    from price_keeper import state

    gone, tenant = new_tenant(), new_tenant()
    lost, receipt = submit(gone), submit(tenant)
    for resource in (keys.ROOT_RESOURCE, keys.app_resource(gone.app_id)):
        table(tables.CONFIG).delete_item(Key={"org_key": keys.org_key(gone.org_id), "resource_key": resource})
    state.reset()  # a container that never knew it
    reply = deliver(stream())
    assert "batchItemFailures" not in reply and reply["evaluated"] == 2
    assert totals_of(tenant.scope) == expected([receipt]) and totals_of(gone.scope) == expected([lost])


# --- what a fold costs -------------------------------------------------------------------------


def test_a_lone_reports_fold_is_one_progress_read_one_batch_read_and_one_transaction(stream, api, dynamodb_calls):
    """A config label's record (the container's configs and heartbeat are cached after its
    first fold): the shard's progress read strongly; the totals alerts evaluate and the
    sticky labels in one BatchGetItem at half the units (a stale total only fails the
    conditional write); the label total and the shard's progress in one transaction, the
    scope total untouched (the config labels are apart from it), its reply still the
    scope's spend."""
    tenant = new_tenant()
    day = org_day("America/New_York")
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    deliver(stream())  # the container's first: its config read, the config labels stored, the heartbeat
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202
    batch = stream()
    dynamodb_calls.clear()
    assert deliver(batch)["totals_written"] == 1
    calls = [(op, params) for op, params in dynamodb_calls if keys.HEARTBEAT_KEY["usage_key"] not in str(params)]
    assert operations(calls) == {"GetItem": 1, "BatchGetItem": 1, "TransactWriteItems": 1}
    (progress,) = [params for op, params in calls if op == "GetItem"]
    assert progress["Key"] == keys.ledger_shard_key(SHARD) and progress["ConsistentRead"] is True
    (read,) = [params for op, params in calls if op == "BatchGetItem"]
    assert {name: request.get("ConsistentRead", False) for name, request in read["RequestItems"].items()} == {
        tables.DAILY_TOTAL.physical_name: False,
        tables.STICKY_STATE.physical_name: False,
    }
    # its total and every config label's (the ordering's, ultra_premium: the scope's spend), the scope's; sticky
    assert len(keys_asked("BatchGetItem", read, tables.DAILY_TOTAL)) == len(get_config().labels) + 1
    assert len(keys_asked("BatchGetItem", read, tables.STICKY_STATE)) == 1
    (written,) = [params["TransactItems"] for op, params in calls if op == "TransactWriteItems"]
    assert [action["Update"]["Key"] for action in written] == [
        {"usage_key": keys.usage_key(tenant.scope, "premium"), "date_key": keys.day_key(day)},
        keys.ledger_shard_key(SHARD),
    ]
    assert label_total(tenant.scope, "premium")["requests"] == 2 and scope_total(tenant.scope) == {}
    answer = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).json()
    assert answer["scope_total"]["spend_usd_micros"] == answer["daily_total"]["cost_usd_micros"] == 2 * 3760


def test_a_scope_of_many_labels_folds_in_transactions_that_fit_and_its_total_stays_small(stream, dynamodb_calls):
    """40 labels of one scope changed at once (an app of many profiles): a transaction per
    as many label-days as its writes let within DynamoDB's 100 actions (a first fold
    adds the label's listing and index entry); every label and the scope total are exact,
    each label is listed once, the scope total holds no list that grows, and the report
    names every label moved, for alerts."""
    tenant = new_tenant()
    labels = with_profiles(tenant, [f"profile-{n:02d}" for n in range(40)])
    bodies = [usage_body(model_label=label, calling_region="us-east-1") for label in labels]
    assert metering.submit_batch(tenant.org_id, tenant.app_id, bodies)["accepted"] == 40

    def fold() -> list[int]:
        records = _records(stream())
        dynamodb_calls.clear()
        report, resume = ledger.fold_batch(records, SHARD)
        changed = {keys.split_usage_key(usage_key)[1] for usage_key, _ in report.changed}
        assert resume is None and changed == set(labels[: len(ledger.changes(records))])
        return [len(params["TransactItems"]) for op, params in dynamodb_calls if op == "TransactWriteItems"]

    # per label-day its total, listing item and index entry; the scope total and the progress:
    # 32 label-days fill a transaction (98 actions), the other 8 the next
    assert fold() == [3 * 32 + 2, 3 * 8 + 2]
    assert [label_total(tenant.scope, label)["cost_usd_micros"] for label in (labels[0], labels[-1])] == [3760, 3760]
    stored = scope_total(tenant.scope)
    assert (stored["cost_usd_micros"], stored["requests"], stored["labels_listed"]) == (40 * 3760, 40, 40)
    assert "labels" not in stored and dynamo.item_size(stored) < 512
    assert spent_labels(tenant.scope, org_day("America/New_York")) == set(labels)
    again = [usage_body(model_label=label, calling_region="us-east-1") for label in labels[:20]]
    assert metering.submit_batch(tenant.org_id, tenant.app_id, again)["accepted"] == 20
    assert fold() == [20 + 2]  # no listing or index entry again
    stored = scope_total(tenant.scope)
    assert (stored["cost_usd_micros"], stored["labels_listed"]) == (60 * 3760, 40)
    assert len(spent_labels(tenant.scope, org_day("America/New_York"))) == 40


# --- deliveries again, failures, races --------------------------------------------------------


def test_a_batch_delivered_again_from_the_chunk_that_failed_counts_every_record_once(stream, monkeypatch):
    """Enough label-days for three chunks (of two, here; 19 deployed: the same code path);
    the second fails: the run names its first record, the mapping delivers the batch again
    from there, and then the whole batch once more."""
    monkeypatch.setattr(ledger, "CHUNK_ACTIONS", 5)  # two config label-days a chunk
    tenants = [new_tenant() for _ in range(2)]
    receipts = {t.scope: [submit(t, label) for label in LABELS] for t in tenants}  # 6 label-days
    batch = stream()
    cut = ledger.chunks(ledger.changes(_records(batch)), orgs.config_labels_ever())
    assert len(cut) == 3
    real = daily_totals.transact

    def second_chunk_fails(actions):
        if actions[-1]["Update"]["ExpressionAttributeValues"][":to"] == cut[1][-1].sequence:
            return [{"Code": "TransactionConflict"}] * len(actions)
        return real(actions)

    monkeypatch.setattr(daily_totals, "transact", second_chunk_fails)
    monkeypatch.setattr(aggregation, "FOLD_ATTEMPTS", 2)
    reply = deliver(batch)
    (failure,) = reply["batchItemFailures"]
    resume = next(
        n for n, record in enumerate(batch) if record["dynamodb"]["SequenceNumber"] == failure["itemIdentifier"]
    )
    assert daily_totals.sequence_key(batch[resume]["dynamodb"]["SequenceNumber"]) == cut[1][0].sequence
    monkeypatch.setattr(daily_totals, "transact", real)
    assert "batchItemFailures" not in deliver(batch[resume:])
    deliver(batch)
    for scope, mine in receipts.items():
        assert totals_of(scope) == expected(mine)


def test_a_chunk_delivered_again_further_counts_only_its_new_records(stream):
    tenant = new_tenant()
    receipts = [submit(tenant) for _ in range(3)]
    batch = markers(stream())
    deliver(batch[:2])
    assert totals_of(tenant.scope) == expected(receipts[:2])
    deliver(batch)  # the same first record, one more: a chunk of its own after the one written
    assert totals_of(tenant.scope) == expected(receipts)
    deliver(batch)
    assert totals_of(tenant.scope) == expected(receipts)


def test_a_fold_that_read_before_another_batch_wrote_its_label_reads_again(stream, monkeypatch):
    """Two batches of two stream shards fold one label at once: the one whose read went
    stale loses its transaction on the label total's progress, reads again and adds its records."""
    tenant = new_tenant()
    first_receipts = [submit(tenant) for _ in range(2)]
    first_batch = stream()
    later_receipts = [submit(tenant) for _ in range(3)]
    later_batch = stream()
    real, calls = daily_totals.transact, []

    def another_batch_writes_first(actions):
        calls.append(len(actions))
        if len(calls) == 1:  # this fold has read the label's total: the other one lands now
            monkeypatch.setattr(daily_totals, "transact", real)
            ledger.fold_batch(_records(later_batch), "another-shard")
            monkeypatch.setattr(daily_totals, "transact", another_batch_writes_first)
        return real(actions)

    monkeypatch.setattr(daily_totals, "transact", another_batch_writes_first)
    assert ledger.fold_batch(_records(first_batch), SHARD).resume_at is None
    assert len(calls) == 2  # the stale write, and the one after reading again
    assert totals_of(tenant.scope) == expected(first_receipts + later_receipts)


def test_a_chunk_overtaken_by_other_shards_folds_more_often_than_its_attempts_still_lands(stream, monkeypatch):
    """A hot label's total is written by every stream shard's fold: a chunk whose read went
    stale because another shard wrote first reads again at once, and that is no failed
    attempt. Counted as one, the chunk stopped after ``FOLD_ATTEMPTS`` and its batch came
    again later, and the fold fell behind (benchmarks/stream_shards.py: 58.6 s behind after
    10 s of a hot label at 40/s, 23.6 s once they were not)."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    tenant = new_tenant()
    receipts = [submit(tenant) for _ in range(3)]
    real, overtaken = daily_totals.transact, []

    def another_shard_wrote_first(actions):
        if len(overtaken) < aggregation.FOLD_ATTEMPTS + 3:
            overtaken.append(len(actions))
            return [{"Code": "ConditionalCheckFailed"}] + [{"Code": "None"}] * (len(actions) - 1)
        return real(actions)

    monkeypatch.setattr(daily_totals, "transact", another_shard_wrote_first)
    assert "batchItemFailures" not in deliver(stream())
    assert len(overtaken) == aggregation.FOLD_ATTEMPTS + 3
    assert totals_of(tenant.scope) == expected(receipts)


def _voided(tenant, receipt) -> None:
    request = bodies.VoidRequest(app_id=tenant.app_id, request_ids=[receipt["request_id"]], reason="test")
    assert voids.void(tenant.org_id, request)["voided"] == 1


def test_a_void_folded_again_with_its_record_returns_and_counts_both_once(stream):
    """Outside review H1: a record and its void, each folded in a delivery of its own, then
    the two delivered again as one batch (a retried batch; locally, a restart's replay). The
    chunked fold left out the record, found its chunk, and priced the void alone on the total
    that already held it: -1 request in the hour mark, on which the mark encoder looped for
    ever, and nobody's usage was folded again (this test hung on that code). Run in a thread,
    so that a hang fails it."""
    import threading

    tenant = new_tenant()
    voided = submit(tenant, "economy")
    insert = stream()
    deliver(insert)
    _voided(tenant, voided)
    void = stream()
    deliver(void)
    replies = []
    again = threading.Thread(target=lambda: replies.append(deliver(insert + void)), daemon=True)
    again.start()
    again.join(timeout=60)
    assert not again.is_alive(), "the fold of the batch delivered again never returned"
    assert "batchItemFailures" not in replies[0]
    total = label_total(tenant.scope, "economy")
    assert (int(total["requests"]), int(total[usage.VOIDS]), int(total["cost_usd_micros"])) == (0, 1, 0)
    later = submit(tenant, "economy")  # and the fold goes on
    deliver(stream())
    assert int(label_total(tenant.scope, "economy")["cost_usd_micros"]) == later["processing"]["cost_usd_micros"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=st.lists(
        st.one_of(
            st.tuples(st.just("report"), st.sampled_from(LABELS)), st.tuples(st.just("void"), st.integers(0, 99))
        ),
        min_size=1,
        max_size=10,
    ),
    deliveries=st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 12), st.one_of(st.none(), st.integers(0, 3))),
        max_size=8,
    ),
)
def test_a_record_counts_once_however_its_stream_records_are_batched(stream, monkeypatch, history, deliveries):
    """Outside review H2: exactly-once may not depend on how a shard's records are cut into
    batches. One stream history of reports and voids is delivered as the mapping might: each
    batch starting anywhere at or before where the last left off (a retried batch, a
    restart's replay), of any length, some failing at one of their chunks (the mapping
    resumes at the record the reply names); then the rest until all is folded. Chunks of one
    label-day each, so batches cut through them everywhere. The totals are always exactly
    those of the records and voids, as one fold of it all gives."""
    tenant = new_tenant()
    receipts, voided = [], set()
    for kind, which in history:
        if kind == "report":
            receipts.append(submit(tenant, which))
        elif receipts and (n := which % len(receipts)) not in voided:
            _voided(tenant, receipts[n])
            voided.add(n)
    records = markers(stream())
    sequences = [record["dynamodb"]["SequenceNumber"] for record in records]
    real, failing = daily_totals.transact, {"at": None}

    def fail_one_chunk(actions):
        """The ``failing["at"]``-th chunk's transaction of a delivery conflicts (as many times as tried)."""
        if failing["at"] is not None and "Update" in actions[-1]:
            failing["at"] -= 1
            if failing["at"] < 0:
                failing["at"] = None
                return [{"Code": "TransactionConflict"}] * len(actions)
        return real(actions)

    shard = f"shardId-{uuid.uuid4().hex}"  # a shard of its own per example
    with monkeypatch.context() as patched:  # undone after each example
        patched.setattr(ledger, "CHUNK_ACTIONS", 3)  # one config label-day a chunk
        patched.setattr(aggregation, "FOLD_ATTEMPTS", 1)
        patched.setattr(dynamo, "_backoff", lambda attempt: None)
        patched.setattr(daily_totals, "transact", fail_one_chunk)
        at = 0
        for back, length, fail_at in deliveries:
            start = max(0, at - back)
            failing["at"] = fail_at
            reply = deliver(records[start : start + length], shard) if records[start : start + length] else {}
            named = [failure["itemIdentifier"] for failure in reply.get("batchItemFailures", ())]
            at = sequences.index(named[0]) if named else max(at, min(start + length, len(records)))
        failing["at"] = None
        if records[at:]:
            assert "batchItemFailures" not in deliver(records[at:], shard)
    kept = [receipt for n, receipt in enumerate(receipts) if n not in voided]
    assert totals_of(tenant.scope) == {label: value for label, value in expected(kept).items()} | {
        label: (0, 0) for label in {r["daily_total"]["label"] for r in receipts} - set(expected(kept))
    }
    for label in LABELS:
        if found := label_total(tenant.scope, label):
            assert int(found[usage.VOIDS]) == sum(1 for n in voided if receipts[n]["daily_total"]["label"] == label)


def test_a_stream_batch_must_name_its_shard_and_a_windows_last_invocation_folds_nothing(stream):
    """The shard progress needs the shard: a stream event without the tumbling window's
    ``shardId`` fails loudly (the mapping delivers it again, and the iterator age says so)
    rather than fold without progress. The window's last invocation brings no records and
    must answer ``state``, or Lambda counts it failed and stops the shard."""
    tenant = new_tenant()
    receipt = submit(tenant)
    records = stream()
    with only_granted("aggregator"), pytest.raises(ValueError, match="shardId"):
        load_handler("aggregator")({"Records": records}, LambdaContext("aggregator"))
    final = {"Records": [], "shardId": SHARD, "state": {}, "isFinalInvokeForWindow": True}
    with only_granted("aggregator"):
        assert load_handler("aggregator")(final, LambdaContext("aggregator")) == {"state": {}}
    assert label_total(tenant.scope, "premium") == {}  # nothing folded without the shard
    deliver(records)
    assert totals_of(tenant.scope) == expected([receipt])


def test_the_local_trigger_delivers_a_batch_again_from_the_chunk_whose_fold_failed(stream, monkeypatch):
    """Two scopes in one stream batch, the second's chunk failing: the aggregator folds the
    first and names the second's first record (``batchItemFailures``), where the mapping
    delivers the batch again; the local trigger does so, and the retry folds the rest."""
    import local.streams
    from local.streams import StreamTrigger
    from tests.test_faults import fail_calls

    monkeypatch.setattr(ledger, "CHUNK_ACTIONS", 3)  # a chunk a scope (one config label-day each)
    folded, failing = new_tenant(), new_tenant()
    receipts = [submit(folded), submit(failing)]
    batch = stream()
    first_of_failing = next(
        r["dynamodb"]["SequenceNumber"]
        for r in markers(batch)
        if failing.org_id in r["dynamodb"]["Keys"]["shard_key"]["S"]
    )
    fail_calls("TransactWriteItems", 1, code="InternalServerError", after=1)
    reply = deliver(batch)
    assert reply == {"state": {}, "batchItemFailures": [{"itemIdentifier": first_of_failing}]}
    assert totals_of(folded.scope) == expected(receipts[:1]) and totals_of(failing.scope) == {}

    delivered = []
    invoke = local.streams.invoke_job
    monkeypatch.setattr(local.streams, "invoke_job", lambda name, event: delivered.append(event) or invoke(name, event))
    fail_calls("TransactWriteItems", 1, code="InternalServerError")  # the first delivery's fold of the failing scope
    with only_granted("aggregator"):
        assert StreamTrigger("aggregator", None, threading.Event())._deliver(SHARD, batch)
    resumed = [r["dynamodb"]["SequenceNumber"] for r in delivered[1]["Records"]]
    assert resumed[0] == first_of_failing and len(resumed) < len(batch)
    assert totals_of(failing.scope) == expected(receipts[1:]) and totals_of(folded.scope) == expected(receipts[:1])


def test_the_local_trigger_delivers_a_failing_batch_again_until_it_is_folded(monkeypatch):
    """As the mapping does with no retry limit: a batch failing more often than the 10
    retries it once had is not given up (a skipped batch would leave records the ledger's
    shard progress has moved past), and each delivery names the batch's shard."""
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


def test_concurrent_folds_of_one_scope_keep_its_total_the_sum_of_its_labels(stream):
    """Batches of a scope's labels from other stream shards race for its total, each also
    delivered twice at once: a transaction whose read went stale reads again, one whose
    shard's progress moved skips what was folded, and nothing is counted twice or lost."""
    tenant = new_tenant(quota_scope="ORG")
    labels = with_profiles(tenant, [f"label-{n}" for n in range(4)])
    receipts, batches = [], []
    for label in labels:
        receipts.append(submit(tenant, label))
        batches.append(stream())
    threads = [
        threading.Thread(target=deliver, args=(batch, f"shardId-{n}")) for n, batch in enumerate(batches) for _ in "ab"
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = scope_total(tenant.scope)
    assert (stored["cost_usd_micros"], stored["requests"]) == (cost(receipts), 4)
    assert totals_of(tenant.scope, labels) == expected(receipts)
    assert spent_labels(tenant.scope, org_day("America/New_York")) == set(labels)


# --- tight mode: live items ------------------------------------------------------------------------


def test_tight_mode_decides_on_the_totals_reading_no_usage_items(stream, dynamodb_calls):
    """Tight mode reads no usage items: it decides on the totals (and the live items, ``daily_totals``)."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection

    tenant = new_tenant(
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    submit(tenant)
    deliver(stream())
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    dynamodb_calls.clear()
    assert selection.recommend(config, datetime.now(UTC))[0]["quota_status"]["mode"] == "TIGHT"
    usage_table = tables.USAGE_AGG_SHARDED.physical_name
    assert not [op for op, params in dynamodb_calls if usage_table in params.get("RequestItems", {})]


def test_a_tight_label_days_records_go_on_its_live_item_until_folded(stream, dynamodb_calls):
    """Tight mode sees past the fold's lag: a record of a tight label-day ADDs its cost to one
    of the label-day's live items, then puts its marker; selection adds the live items to the
    total, and the fold takes the cost back once, however often it is delivered."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection
    from price_keeper.store import daily_totals

    tenant = new_tenant(
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    first = submit(tenant)  # the label-day is not tight yet: a PutItem
    deliver(stream())
    usage_key, day = keys.usage_key(tenant.scope, "premium"), org_day("America/New_York")
    assert daily_totals.live_costs([usage_key], day) == {}
    dynamodb_calls.clear()
    with only_granted("usage"):
        second = submit(tenant)  # tight now: its cost on a live item, then its marker
    writes = [op for op, _ in dynamodb_calls if op in ("PutItem", "UpdateItem", "TransactWriteItems")]
    assert writes == ["UpdateItem", "PutItem"]
    cost = second["processing"]["cost_usd_micros"]
    assert daily_totals.live_costs([usage_key], day) == {usage_key: cost}
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    status = selection.recommend(config, datetime.now(UTC))[0]["quota_status"]["models_status"]["premium"]
    assert status["spend_usd_micros"] == first["processing"]["cost_usd_micros"] + cost  # the total lags; live does not
    batch = stream()
    deliver(batch)
    deliver(batch)  # delivered again: the checkpoint keeps the live item from going below
    assert daily_totals.live_costs([usage_key], day) == {usage_key: 0}
    assert totals_of(tenant.scope)["premium"] == (first["processing"]["cost_usd_micros"] + cost, 2)


def test_a_tight_record_sent_again_over_http_leaves_one_cost_on_the_live_items(stream, api):
    """A client retrying a tight record (the same request id, single or in a batch) adds its
    cost to a live item again, and takes it back at once as the duplicate it is: the live
    items hold each counted record once, so a retry cannot make tight mode miss or double it."""
    from price_keeper.store import daily_totals

    tenant = new_tenant(
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    submit(tenant)
    deliver(stream())  # premium is tight now
    body = usage_body()
    first = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    again = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    batch = api.post(f"{tenant.app_path}/usage/batch", {"requests": [body]}, token=tenant.token)
    assert (first.status, again.status, batch.status) == (202, 202, 207)
    assert again.json()["duplicate"] and batch.json()["results"][0]["duplicate"]
    usage_key, day = keys.usage_key(tenant.scope, "premium"), org_day("America/New_York")
    cost = first.json()["processing"]["cost_usd_micros"]
    assert daily_totals.live_costs([usage_key], day) == {usage_key: cost}
    deliver(stream())
    assert daily_totals.live_costs([usage_key], day) == {usage_key: 0}


def test_a_batchs_records_of_a_tight_label_day_add_to_their_live_items_before_their_markers(stream, dynamodb_calls):
    """A batch reads its answer before writing too: the records of a tight label-day add
    their costs to their live items first, one UpdateItem a live item and never in a
    transaction (a hot label's live items take single writes, which queue, where
    transactions would cancel each other), then each record is a PutItem of its marker, as
    a quiet label-day's are; the fold takes the live costs back."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection

    tenant = new_tenant(
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    first = submit(tenant)
    standard = submit(tenant, "standard")
    deliver(stream())  # premium is tight now (its first record passed 1 % of its quota), standard is not
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    records = [usage_body(model_label=label) for label in ("premium", "premium", "standard", "premium")]
    dynamodb_calls.clear()
    with only_granted("usage_batch"):
        reply = metering.submit_batch(config.org_id, config.app_id, records)
    assert reply["accepted"] == 4
    writes = [(op, params) for op, params in dynamodb_calls if op in ("PutItem", "UpdateItem", "TransactWriteItems")]
    tight = [
        keys.marker_key(tenant.org_id, tenant.app_id, r["request_id"], 8)
        for r in records
        if r["model_label"] == "premium"
    ]
    parts = {keys.live_part(marker_key) for marker_key in tight}
    live_items = [params["Key"]["date_key"] for op, params in writes if op == "UpdateItem"]
    assert sorted(live_items) == sorted(keys.live_day_key(org_day("America/New_York"), part) for part in parts)
    assert [op for op, _ in writes] == ["UpdateItem"] * len(parts) + ["PutItem"] * 4  # live first, then markers
    usage_key, day = keys.usage_key(tenant.scope, "premium"), org_day("America/New_York")
    live_cost = sum(result["cost_usd_micros"] for result in reply["results"][:2] + reply["results"][3:])
    assert daily_totals.live_costs([usage_key], day) == {usage_key: live_cost}
    status = selection.recommend(config, datetime.now(UTC))[0]["quota_status"]["models_status"]["premium"]
    assert status["spend_usd_micros"] == first["processing"]["cost_usd_micros"] + live_cost
    batch = stream()
    deliver(batch)
    deliver(batch)
    # each live item is taken back from the one its records went on
    for part in range(keys.LIVE_PARTS):
        item = table(tables.DAILY_TOTAL).get_item(
            Key={"usage_key": usage_key, "date_key": keys.live_day_key(day, part)}
        )
        assert int(item.get("Item", {}).get("cost_usd_micros", 0)) == 0, part
    assert totals_of(tenant.scope)["premium"] == (first["processing"]["cost_usd_micros"] + live_cost, 4)
    assert totals_of(tenant.scope)["standard"][1] == 2 and standard["duplicate"] is False


# --- the handler: alerts, reply, log line, lag ---------------------------------------------------


def test_a_stream_batch_fires_the_alerts_its_totals_cross(stream, api):
    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    assert api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token).status == 202  # 94 %
    batch = stream()
    assert deliver(batch)["alerts_fired"] == 1  # THRESHOLD 80 %
    assert deliver(batch)["alerts_fired"] == 0  # delivered again: fired once


def test_a_stream_runs_reply_and_log_line_are_json(stream, caplog):
    """The run's summary counts the report's maps, whose keys are tuples. As they were, the
    Lambda runtime could not marshal the reply (``Runtime.MarshalError``: every invocation
    that folded something failed and was retried; the local gateway now encodes replies as
    the runtime does), and the logger could not serialise the line (the tests log warnings
    only, so none showed it; a review found both)."""
    from price_keeper.observability import logger

    submit(new_tenant())
    with caplog.at_level("INFO", logger=logger.name):  # as deployed
        reply = deliver(stream())
    assert json.loads(json.dumps(reply))["scope_costs"] == 1
    (record,) = [record for record in caplog.records if record.getMessage() == "aggregation run"]
    line = json.loads(logger.registered_formatter.format(record))
    assert line["report"]["totals_written"] == 1 and line["report"]["scope_costs"] == 1


def test_the_lag_is_the_age_of_the_oldest_record_a_fold_moved_and_the_heartbeat_says_it(stream):
    from datetime import UTC, datetime, timedelta

    from price_keeper import state

    tenant = new_tenant()
    submit(tenant)
    submit(tenant, "standard")
    batch = markers(stream())
    created = datetime.fromtimestamp(min(int(r["dynamodb"]["ApproximateCreationDateTime"]) for r in batch), UTC)
    state.reset()  # a container that wrote no heartbeat yet
    assert ledger.fold_batch(_records(batch), SHARD, created + timedelta(seconds=42)).report.lag_seconds == 42
    heartbeat = table(tables.DAILY_TOTAL).get_item(Key=keys.HEARTBEAT_KEY)["Item"]
    assert (heartbeat["last_run_epoch"], heartbeat["lag_seconds"]) == (int(created.timestamp()) + 42, 42)
    submit(tenant)
    (later,) = markers(stream())
    created = datetime.fromtimestamp(int(later["dynamodb"]["ApproximateCreationDateTime"]), UTC)
    assert ledger.fold_batch(_records([later]), SHARD, created + timedelta(seconds=20)).report.lag_seconds == 20
    assert ledger.fold_batch(_records([later]), SHARD, created + timedelta(seconds=50)).report.lag_seconds == 0
