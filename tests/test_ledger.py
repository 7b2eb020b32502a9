"""The ledger (``metering.ledger_from``): a record is its dedup marker alone, and the
aggregator folds the usage stream's images of the markers into the totals exactly once,
however the event source mapping delivers a batch again."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local.gateway import LambdaContext, load_handler
from price_keeper.config import config_path, get_config, read_raw
from price_keeper.domain import aggregation, ledger, metering, orgs, voids
from price_keeper.domain.models import UsageRequest
from price_keeper.store import daily_totals, dynamo, keys, tables, usage
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_day
from tests.iam_check import only_granted
from tests.test_alerts import bus  # noqa: F401 - the fixture: the service bus delivering to a queue
from tests.test_profiles import bedrock  # noqa: F401 - the fixture: Bedrock's stand-in
from tests.usage_support import new_tenant, usage_body

LABELS = ("premium", "standard", "economy")


@pytest.fixture
def ledger_days(aws, monkeypatch, tmp_path):
    """config.yaml with every org day counted by the ledger."""
    raw = read_raw(config_path())
    raw["metering"]["ledger_from"] = "20200101"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setenv("PRICE_KEEPER_CONFIG", str(path))
    get_config.cache_clear()
    assert get_config().metering.ledger_from == "20200101"
    yield
    monkeypatch.delenv("PRICE_KEEPER_CONFIG", raising=False)
    get_config.cache_clear()


SHARD = "shardId-00000001700000000000-0000000a"  # the stream shard the tests' batches come from


@pytest.fixture
def stream(ledger_days):
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
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    body = usage_body(request_id=request_id, model_label=label, **fields)
    body["bedrock_model_id"] = get_config().labels[label].id
    return metering.submit(config.org_id, config.app_id, UsageRequest.model_validate(body))


def label_total(scope: str, label: str) -> dict:
    day = keys.day_key(org_day("America/New_York"))
    key = {"usage_key": keys.usage_key(scope, label), "date_key": day}
    return table(tables.DAILY_TOTAL).get_item(Key=key).get("Item") or {}


def totals_of(scope: str) -> dict[str, tuple[int, int]]:
    return {
        label: (int(found.get("cost_usd_micros", 0)), int(found.get("requests", 0)))
        for label in LABELS
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
    deliver(stream())
    dynamodb_calls.clear()
    with only_granted("usage"):
        first = submit(tenant)
    writes = [(op, params.get("TableName")) for op, params in dynamodb_calls if op in ("PutItem", "TransactWriteItems")]
    assert writes == [("PutItem", tables.USAGE_AGG_SHARDED.physical_name)]  # 1 write unit, not the transaction's 4
    assert listing["duplicate"] is False
    marker = usage.read_marker(keys.dedup_key(tenant.org_id, tenant.app_id, first["request_id"]))
    assert marker[usage.LEDGER] == 1 and marker["cost_usd_micros"] == first["processing"]["cost_usd_micros"]
    shards = usage.read_shards(keys.shard_item_keys(tenant.scope, "premium", keys.day_key(marker["org_day"]), 1), [])
    assert [shard.get("requests", 0) for shard in shards] == [0]  # its index entry alone: no counters
    again = submit(tenant, request_id=first["request_id"])
    assert again["duplicate"] is True
    assert again["processing"]["cost_usd_micros"] == first["processing"]["cost_usd_micros"]


def test_the_stream_folds_ledger_records_into_their_totals_once_however_often_delivered(stream):
    tenant = new_tenant()
    receipts = [submit(tenant, label) for label in ("premium", "premium", "standard")]
    batch = stream()
    assert deliver(batch)["totals_written"] == 2
    assert totals_of(tenant.scope) == expected(receipts)
    assert deliver(batch)["totals_written"] == 0  # delivered again: every chunk was written
    assert totals_of(tenant.scope) == expected(receipts)
    assert usage.org_has_spend(tenant.org_id, org_day("America/New_York"))  # its label-days are indexed


def test_an_org_scoped_record_of_a_capped_app_counts_in_the_org_and_in_its_app(stream):
    tenant = new_tenant(quota_scope="ORG", app_overrides={"app_daily_cap_usd_micros": 10**9})
    receipt = submit(tenant)
    deliver(stream())
    app_scope = orgs.effective_config(tenant.org_id, tenant.app_id).app_counter
    assert totals_of(tenant.scope) == totals_of(app_scope) == expected([receipt])


def test_a_batch_delivered_again_from_the_chunk_that_failed_counts_every_record_once(stream, monkeypatch):
    """Enough label-days for three chunks; the second fails: the run names its first record,
    the mapping delivers the batch again from there, and then the whole batch once more."""
    tenants = [new_tenant() for _ in range(20)]
    receipts = {t.scope: [submit(t, label) for label in LABELS] for t in tenants}  # 60 label-days
    batch = stream()
    cut = ledger.chunks(ledger.changes(_records(batch)))
    assert len(cut) == -(-60 // ledger.LABEL_DAYS_PER_CHUNK) >= 3
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


def markers(batch: list[dict]) -> list[dict]:
    """The ledger's records of a stream batch (not the index entries of its first records)."""
    return [record for record in batch if record["dynamodb"]["Keys"]["date_key"]["S"] == keys.DEDUP_SORT_KEY]


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


def test_a_void_folds_back_what_the_record_counted_and_a_ttl_removal_nothing(stream):
    tenant = new_tenant()
    kept, voided = submit(tenant), submit(tenant)
    deliver(stream())
    result = voids.void(
        tenant.org_id, voids.VoidRequest(app_id=tenant.app_id, request_ids=[voided["request_id"]], reason="test")
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
        Key={
            "shard_key": keys.dedup_key(tenant.org_id, tenant.app_id, kept["request_id"]),
            "date_key": keys.DEDUP_SORT_KEY,
        }
    )
    deliver(stream())
    assert int(label_total(tenant.scope, "premium")["cost_usd_micros"]) == kept["processing"]["cost_usd_micros"]


def _records(batch: list[dict]):
    from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

    return list(DynamoDBStreamEvent({"Records": batch}).records)


def test_a_marker_of_a_day_before_the_ledger_is_the_shard_folds(aws):
    """Without ``ledger_from`` nothing changes: a record is the marker-and-shard transaction."""
    tenant = new_tenant()
    receipt = submit(tenant)
    marker = usage.read_marker(keys.dedup_key(tenant.org_id, tenant.app_id, receipt["request_id"]))
    assert usage.LEDGER not in marker
    assert ledger.counted(None) == ledger.counted({}) == dict.fromkeys(aggregation.SUM_FIELDS, 0)
    assert str(uuid.UUID(receipt["request_id"])) == receipt["request_id"]


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
            ledger.fold(_records(later_batch), "another-shard")
            monkeypatch.setattr(daily_totals, "transact", another_batch_writes_first)
        return real(actions)

    monkeypatch.setattr(daily_totals, "transact", another_batch_writes_first)
    assert ledger.fold(_records(first_batch), SHARD).failed_at is None
    assert len(calls) == 2  # the stale write, and the one after reading again
    assert totals_of(tenant.scope) == expected(first_receipts + later_receipts)


def test_a_shard_fold_failing_inside_a_ledger_chunk_resumes_there_and_counts_nothing_twice(stream, monkeypatch):
    """A batch of both kinds: a scope-day of the shard fold fails at a record that falls
    inside a written ledger chunk. The batch comes again from that record, a cut the first
    delivery never made, and the ledger's records before it are not counted again."""
    tenant = new_tenant()
    receipts = [submit(tenant) for _ in range(3)]
    records = _records(markers(stream()))
    with monkeypatch.context() as patched:
        patched.setattr(aggregation, "first_unfolded", lambda *_: records[1].dynamodb.sequence_number)
        _, resume = ledger.fold_batch(records, SHARD)
    assert resume == records[1].dynamodb.sequence_number
    assert ledger.fold(records[1:], SHARD).failed_at is None  # delivered again from there
    assert totals_of(tenant.scope) == expected(receipts)


def test_a_batchs_ledger_records_are_a_put_each_and_its_repeats_duplicates(stream, dynamodb_calls):
    tenant = new_tenant()
    counted_before, *_ = [submit(tenant, label) for label in LABELS]  # each label-day has its total
    deliver(stream())
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    bodies = [usage_body(model_label=label) for label in LABELS]
    for body, label in zip(bodies, LABELS, strict=True):
        body["bedrock_model_id"] = get_config().labels[label].id
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


def test_tight_mode_on_a_ledger_day_reads_no_shards(stream, dynamodb_calls):
    """A ledger day has no shards to read live spend from: tight mode decides on the totals."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection

    tenant = new_tenant(
        first_shard_count=1,
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
    """Tight mode on a ledger day sees past the fold's lag: a record of a tight label-day is a
    transaction of its marker and an ADD to the label-day's live item, which selection adds
    to the total; the fold takes it back once, however often it is delivered."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection
    from price_keeper.store import daily_totals

    tenant = new_tenant(
        first_shard_count=1,
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    first = submit(tenant)  # the label-day is not tight yet: a PutItem
    deliver(stream())
    usage_key, day = keys.usage_key(tenant.scope, "premium"), org_day("America/New_York")
    assert daily_totals.live_costs([usage_key], day) == {}
    dynamodb_calls.clear()
    with only_granted("usage"):
        second = submit(tenant)  # tight now: the marker and the live item together
    assert [op for op, _ in dynamodb_calls if op in ("PutItem", "TransactWriteItems")] == ["TransactWriteItems"]
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


def test_a_batchs_records_of_a_tight_label_day_go_on_its_live_item_in_one_transaction(stream, dynamodb_calls):
    """A batch reads its answer before writing too: the records of a tight label-day are one
    transaction of their markers and one ADD of their costs to the live item (one action an
    item); a quiet label-day's records are still a PutItem each; the fold takes it back."""
    from datetime import UTC, datetime

    from price_keeper.domain import selection

    tenant = new_tenant(
        first_shard_count=1,
        quotas={"premium": 100_000, "standard": 10**9, "economy": 10**9},
        tight_mode_threshold_pct=1,
    )
    first = submit(tenant)
    standard = submit(tenant, "standard")
    deliver(stream())  # premium is tight now (its first record passed 1 % of its quota), standard is not
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    records = [usage_body(model_label=label) for label in ("premium", "premium", "standard", "premium")]
    for record in records:
        record["bedrock_model_id"] = get_config().labels[record["model_label"]].id
    dynamodb_calls.clear()
    with only_granted("usage_batch"):
        reply = metering.submit_batch(config.org_id, config.app_id, records)
    assert reply["accepted"] == 4
    writes = [(op, params) for op, params in dynamodb_calls if op in ("PutItem", "TransactWriteItems")]
    assert sorted(op for op, _ in writes) == ["PutItem", "TransactWriteItems"]
    (transaction,) = [params["TransactItems"] for op, params in writes if op == "TransactWriteItems"]
    tight = [
        keys.dedup_key(tenant.org_id, tenant.app_id, r["request_id"]) for r in records if r["model_label"] == "premium"
    ]
    parts = {keys.live_part(dedup_key) for dedup_key in tight}
    assert len(transaction) == 3 + len(parts)  # three markers and one ADD a live item they go on
    live_items = [a["Update"]["Key"]["date_key"] for a in transaction if "Update" in a]
    assert sorted(live_items) == sorted(keys.live_day_key(org_day("America/New_York"), part) for part in parts)
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


def _voided(tenant, receipt) -> None:
    request = voids.VoidRequest(app_id=tenant.app_id, request_ids=[receipt["request_id"]], reason="test")
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
        patched.setattr(ledger, "LABEL_DAYS_PER_CHUNK", 1)
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
