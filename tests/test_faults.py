"""Faults injected into DynamoDB mid-request: clients get a retryable 503 (a batch record a
retryable failure of its own), and a retried record is still counted exactly once."""

import json
import threading
from types import SimpleNamespace

import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

from local import gateway
from local.streams import StreamReader, lambda_event
from price_keeper import state
from price_keeper.domain import ledger, orgs
from price_keeper.store import dynamo, keys, tables, usage
from price_keeper.store.dynamo import ddb_client
from price_keeper.timeutil import org_day
from tests.conftest import assert_error
from tests.factories import seed_org
from tests.iam_check import only_granted
from tests.usage_support import daily_total, new_tenant, usage_body

RECORD_COST_USD_MICROS = 3_760  # usage_body(): 1,500 input + 800 output tokens of premium
FOREVER = 10**9  # calls: until the test brings the store back


def fail_calls(
    operation: str,
    times: int,
    code: str = "ProvisionedThroughputExceededException",
    after: int = 0,
    unreachable: bool = False,
    reply_lost: bool = False,
    reasons: list[dict] | None = None,
):
    """Let ``after`` calls of ``operation`` (``*``: any) through, then fail the next ``times``
    as a throttled (or erring) DynamoDB would. The injected reply replaces the whole call,
    botocore's own retries included, so each injected failure is a store that kept failing.

    ``unreachable``: raise ``EndpointConnectionError`` instead, as botocore does once it gives
    up on a store it cannot connect to. ``reply_lost``: the call reaches the store and is
    applied; then the connection drops (``ConnectionClosedError``) and the reply is lost.
    ``reasons``: the ``CancellationReasons`` of a ``TransactionCanceledException``.
    Setting ``["n"] = 0`` on the returned counters brings the store back.
    """
    left = {"n": times, "passed": after}
    endpoint = ddb_client().meta.endpoint_url

    def fail(**_):
        if left["passed"] > 0:
            left["passed"] -= 1
            return None
        if left["n"] <= 0:
            return None
        left["n"] -= 1
        if reply_lost:
            raise ConnectionClosedError(endpoint_url=endpoint)
        if unreachable:
            raise EndpointConnectionError(endpoint_url=endpoint)
        return SimpleNamespace(status_code=400), {
            "Error": {"Code": code, "Message": "injected"},
            **({"CancellationReasons": reasons} if reasons is not None else {}),
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }

    ddb_client().meta.events.register(f"{'after' if reply_lost else 'before'}-call.dynamodb.{operation}", fail)
    return left


def assert_retryable(reply) -> None:
    """503 ``SERVICE_UNAVAILABLE`` in the error schema, with ``Retry-After``."""
    body = assert_error(reply, 503, "SERVICE_UNAVAILABLE")
    assert reply.headers["retry-after"] == "1" and body["retry_after"] == 1


def assert_counted_once(fold_stream, tenant, records: int = 1) -> None:
    """The usage stream folded (``fold_stream``): the tenant's records counted once each."""
    fold_stream()
    total = daily_total(tenant.scope, "premium", org_day("America/New_York"))
    assert total["requests"] == records and total["cost_usd_micros"] == records * RECORD_COST_USD_MICROS


def test_throttled_store_is_503_and_the_retry_counts_once(api, fold_stream):
    tenant = new_tenant()
    body = usage_body()
    fail_calls("TransactWriteItems", 3)
    for _ in range(3):  # the store stays throttled across the client's first retries
        assert_retryable(api.post(f"{tenant.app_path}/usage", body, token=tenant.token))
    for _ in range(2):  # the client retries (twice, even) with the same request_id
        assert api.post(f"{tenant.app_path}/usage", body, token=tenant.token).status == 202
    assert_counted_once(fold_stream, tenant)


def test_a_transaction_still_in_progress_under_its_token_is_503_and_the_retry_counts_once(api, fold_stream):
    """A slow usage transaction that the SDK sent again under the same ClientRequestToken
    answers TransactionInProgressException until the first completes: retryable, not a 500."""
    tenant = new_tenant()
    body = usage_body()
    fail_calls("TransactWriteItems", 1, code="TransactionInProgressException")
    assert_retryable(api.post(f"{tenant.app_path}/usage", body, token=tenant.token))
    assert api.post(f"{tenant.app_path}/usage", body, token=tenant.token).status == 202
    assert_counted_once(fold_stream, tenant)


def test_unreachable_store_is_503_on_usage_and_the_retry_counts_once(api, fold_stream):
    tenant = new_tenant()
    body = usage_body()
    store = fail_calls("*", FOREVER, unreachable=True)
    for _ in range(2):
        assert_retryable(api.post(f"{tenant.app_path}/usage", body, token=tenant.token))
    store["n"] = 0  # the store is back
    first = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    again = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    assert (first.status, first.json()["duplicate"]) == (202, False)
    assert (again.status, again.json()["duplicate"]) == (202, True)
    assert_counted_once(fold_stream, tenant)


@pytest.mark.parametrize("busy", ["throttled", "keys left unprocessed"])
def test_a_counted_report_whose_selection_the_store_cannot_read_is_answered_without_one(
    api, fold_stream, monkeypatch, busy
):
    """The selection a report asked for (``?model_selection=true``) is read after the record is
    counted, with the totals the answer shows: a store too busy for that read leaves the
    selection out of the 202 (the totals read again on their own), and the record counted,
    rather than answering a counted record 503."""
    tenant = new_tenant()
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202  # warm caches
    if busy == "throttled":  # the read with the selection fails (a warm report reads nothing before it)
        store = fail_calls("BatchGetItem", 1)
    else:  # the selection's read (the only one of StickyState) comes back unprocessed
        monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
        store = {"n": 1}

        def leave_sticky_keys_unprocessed(params, **_):
            request = json.loads(params["body"])["RequestItems"]
            if store["n"] and tables.STICKY_STATE.physical_name in request:
                return SimpleNamespace(status_code=200), {
                    "Responses": {},
                    "UnprocessedKeys": request,
                    "ResponseMetadata": {"HTTPStatusCode": 200},
                }
            return None

        ddb_client().meta.events.register("before-call.dynamodb.BatchGetItem", leave_sticky_keys_unprocessed)
    reply = api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token, query="model_selection=true")
    assert reply.status == 202 and reply.json()["duplicate"] is False
    assert "model_selection" not in reply.json()
    assert reply.json()["daily_total"]["label"] == "premium" and reply.json()["scope_total"]["quota_usd_micros"] > 0
    store["n"] = 0
    assert_counted_once(fold_stream, tenant, records=2)


def test_unreachable_store_is_503_on_model_selection(api):
    tenant = new_tenant()
    store = fail_calls("*", FOREVER, unreachable=True)
    assert_retryable(api.get(f"{tenant.app_path}/model-selection", token=tenant.token))
    store["n"] = 0
    reply = api.get(f"{tenant.app_path}/model-selection", token=tenant.token)
    assert reply.status == 200 and reply.json()["recommended_model"]["label"] == "premium"


def test_unreachable_store_is_503_on_the_token_endpoint(api):
    org_id = seed_org()
    credentials = {"client_id": f"org-{org_id}", "client_secret": "org-secret", "grant_type": "client_credentials"}
    store = fail_calls("*", FOREVER, unreachable=True)
    assert_retryable(api.post("/auth/token", credentials))
    store["n"] = 0
    assert api.post("/auth/token", credentials).status == 200


def test_a_write_whose_reply_was_lost_is_503_and_the_retry_counts_once(api, fold_stream):
    """The transaction landed but the connection dropped before its reply: the client sees a
    503 and retries; the dedup item written with the record makes the retry a duplicate."""
    tenant = new_tenant()
    body = usage_body()
    fail_calls("TransactWriteItems", 1, reply_lost=True)
    assert_retryable(api.post(f"{tenant.app_path}/usage", body, token=tenant.token))
    retry = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    assert (retry.status, retry.json()["duplicate"]) == (202, True)
    assert_counted_once(fold_stream, tenant)


def test_a_batch_throttled_part_way_fails_only_those_records_and_its_resubmission_counts_each_once(
    api, fold_stream, monkeypatch
):
    """A batch's records of a label-day not folded yet share transactions of up to 100
    actions (here 3: two markers and the label-day's index entry); the one that meets a
    throttled store fails its records alone."""
    monkeypatch.setattr(usage, "MAX_TRANSACTION_ACTIONS", 3)
    tenant = new_tenant()
    batch = {"requests": [usage_body() for _ in range(6)]}
    request_ids = [record["request_id"] for record in batch["requests"]]
    fail_calls("TransactWriteItems", 1, after=1)  # records 3 and 4 of 6 meet a throttled store
    reply = api.post(f"{tenant.app_path}/usage/batch", batch, token=tenant.token)
    assert reply.status == 207, reply
    first = reply.json()
    assert (first["accepted"], first["failed"]) == (4, 2)
    assert [result["request_id"] for result in first["results"]] == request_ids
    for n, result in enumerate(first["results"]):
        if n in (2, 3):
            assert (result["status"], result["error"]) == ("failed", "SERVICE_UNAVAILABLE"), result
        else:
            assert (result["status"], result["duplicate"]) == ("accepted", False), result
            assert result["cost_usd_micros"] == RECORD_COST_USD_MICROS

    again = api.post(f"{tenant.app_path}/usage/batch", batch, token=tenant.token).json()
    assert (again["accepted"], again["failed"]) == (6, 0)
    assert [result["duplicate"] for result in again["results"]] == [True, True, False, False, True, True]
    assert_counted_once(fold_stream, tenant, records=6)


def deliver(records: list[dict], shard_id: str) -> dict:
    """The aggregator, as the usage stream's event source mapping invokes it with a shard's
    batch, within its role: its reply."""
    with only_granted("aggregator"):
        return gateway.load_handler("aggregator")(lambda_event(records, shard_id), gateway.LambdaContext("aggregator"))


def test_aggregator_resumes_after_a_failed_run_without_double_counting(api, monkeypatch):
    """A stream batch whose fold fails part-way names the first record not folded; the
    mapping delivers the batch again from it, and a batch delivered again whole (a timed-out
    invocation's) is skipped by the shard's progress: every record counted once."""
    monkeypatch.setattr(ledger, "CHUNK_ACTIONS", 3)  # a scope's record a chunk: its own transaction
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    tenants = [new_tenant(app_id=f"app-{n}") for n in range(3)]
    for tenant in tenants:
        assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    event = reader.event()
    records, shard_id = event["Records"], event["shardId"]
    markers = [r for r in records if keys.is_marker(r["dynamodb"]["Keys"]["date_key"]["S"])]
    assert len(markers) == 3
    fail_calls("TransactWriteItems", 1, code="InternalServerError", after=1)  # the second scope's chunk fails
    reply = deliver(records, shard_id)
    assert reply["batchItemFailures"] == [{"itemIdentifier": markers[1]["dynamodb"]["SequenceNumber"]}]
    day = org_day("America/New_York")

    def totals():
        return [daily_total(keys.scope_key(t.org_id, t.app_id, "APP"), "premium", day) for t in tenants]

    assert [total is not None for total in totals()] == [True, False, False]  # folded up to the failed chunk
    again = records[records.index(markers[1]) :]  # the mapping resumes at the named record
    assert "batchItemFailures" not in deliver(again, shard_id)
    assert "batchItemFailures" not in deliver(records, shard_id)  # the whole batch once more
    for total in totals():
        assert total["requests"] == 1 and total["cost_usd_micros"] == 3_760


def test_a_fold_that_meets_a_concurrent_transaction_folds_again_in_the_same_invocation(api, fold_stream, monkeypatch):
    """A fold's transaction (its label totals and the shard's progress) cancelled by a
    concurrent write to one of its items (another stream shard's fold of the same label-day,
    a reservation's transaction: ``TransactionConflict``, which botocore does not retry) is
    read and written again, as a lost race, instead of failing the stream batch."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    tenant = new_tenant()
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    orgs.record_config_labels()  # as an aggregator container that folded before
    conflict = fail_calls(
        "TransactWriteItems",
        1,
        code="TransactionCanceledException",
        reasons=[{"Code": "TransactionConflict"}, {"Code": "None"}, {"Code": "None"}],
    )
    reply = fold_stream()
    assert conflict["n"] == 0 and "batchItemFailures" not in reply
    total = daily_total(tenant.scope, "premium", org_day("America/New_York"))
    assert total["requests"] == 1 and total["cost_usd_micros"] == RECORD_COST_USD_MICROS


def test_a_config_read_left_unprocessed_is_503_never_not_registered(api, fold_stream, monkeypatch):
    """A throttled BatchGetItem answers 200 with the keys under ``UnprocessedKeys``. Read as
    "no item", the org looked unregistered (404, which a client treats as final and drops
    the record); the read is retried and then a retryable 503, and nothing is cached."""
    tenant = new_tenant()
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    config_table = tables.CONFIG.physical_name
    throttled = {"on": True}

    def leave_config_keys_unprocessed(params, **_):
        request = json.loads(params["body"])["RequestItems"]
        if throttled["on"] and config_table in request:
            return SimpleNamespace(status_code=200), {
                "Responses": {},
                "UnprocessedKeys": request,
                "ResponseMetadata": {"HTTPStatusCode": 200},
            }
        return None

    state.reset()  # the token fixture read the config: start from a cold container
    ddb_client().meta.events.register("before-call.dynamodb.BatchGetItem", leave_config_keys_unprocessed)
    body = usage_body()
    assert_retryable(api.post(f"{tenant.app_path}/usage", body, token=tenant.token))
    assert_retryable(api.get(f"{tenant.app_path}/model-selection", token=tenant.token))
    throttled["on"] = False
    assert api.post(f"{tenant.app_path}/usage", body, token=tenant.token).status == 202
    assert_counted_once(fold_stream, tenant)


def test_a_read_of_many_keys_in_concurrent_calls_retries_only_the_part_left_unprocessed(aws, monkeypatch):
    """More than 100 keys are read by several BatchGetItem calls at once; one of them coming
    back unprocessed is retried on its own, and every item is found once."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    totals = dynamo.table(tables.DAILY_TOTAL)
    wanted = [{"usage_key": f"ORG#many#LABEL#l{n}", "date_key": "DAY#20260123"} for n in range(250)]
    with totals.batch_writer() as batch:
        for key in wanted:
            batch.put_item(Item={**key, "cost_usd_micros": 1})
    calls = {"n": 0, "left": 1}
    lock = threading.Lock()  # the calls come from the read's threads

    def leave_one_call_unprocessed(params, **_):
        with lock:
            calls["n"] += 1
            unprocessed, calls["left"] = calls["left"] > 0, max(0, calls["left"] - 1)
        if unprocessed:
            return SimpleNamespace(status_code=200), {
                "Responses": {},
                "UnprocessedKeys": json.loads(params["body"])["RequestItems"],
                "ResponseMetadata": {"HTTPStatusCode": 200},
            }
        return None

    ddb_client().meta.events.register("before-call.dynamodb.BatchGetItem", leave_one_call_unprocessed)
    found = dynamo.batch_get(tables.DAILY_TOTAL, wanted)
    assert sorted(item["usage_key"] for item in found) == sorted(key["usage_key"] for key in wanted)
    assert calls["n"] == 3 + 1  # 100 + 100 + 50 keys, and the retry of the one left unprocessed
