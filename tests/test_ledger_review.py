"""A review of the ledger path (``domain.ledger``): deliveries, repairs and stream reads
that lost or double-counted records, or got a fold stuck."""

from __future__ import annotations

import pytest

from price_keeper.domain import aggregation, ledger
from price_keeper.store import dynamo, tables, usage
from tests.test_ledger import (  # noqa: F401 - fixtures
    _records,
    deliver,
    expected,
    ledger_days,
    stream,
    submit,
    totals_of,
)
from tests.usage_support import new_tenant


def test_a_chunk_delivered_again_from_its_first_record_ever_longer_is_not_stuck(stream, monkeypatch):
    """Each delivery of a batch from the same first record, one record longer (a resumed
    batch that gained the stream's newer records), finds the checkpoints of the deliveries
    before it, one after another. Finding one is no failed write: it must not use up the
    chunk's attempts, or from the ``FOLD_ATTEMPTS``-th extension on the chunk can never be
    written again (every retry and the repair fail the same way, and the records are lost)."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    tenant = new_tenant(first_shard_count=1)
    receipts = [submit(tenant) for _ in range(aggregation.FOLD_ATTEMPTS + 2)]
    batch = stream()
    assert len(ledger.changes(_records(batch))) == len(receipts)
    for end in range(1, len(batch) + 1):
        assert "batchItemFailures" not in deliver(batch[:end]), f"stuck at a delivery of {end} records"
    assert totals_of(tenant.scope) == expected(receipts)


class _EmptyPageFirst:
    """A DynamoDB Streams client whose first GetRecords of an iterator answers an empty page
    (as DynamoDB Streams may: "it might take multiple calls to get to a portion of the shard
    that contains stream records"), then the real ones."""

    def __init__(self, real):
        self.real, self.seen = real, set()
        self.exceptions = real.exceptions

    def get_shard_iterator(self, **kwargs):
        return self.real.get_shard_iterator(**kwargs)

    def get_records(self, ShardIterator, **kwargs):  # noqa: N803 - boto3's name
        if ShardIterator not in self.seen:
            self.seen.add(ShardIterator)
            return {"Records": [], "NextShardIterator": ShardIterator}
        return self.real.get_records(ShardIterator=ShardIterator, **kwargs)


def test_a_given_up_batch_is_repaired_whole_though_the_stream_answers_an_empty_page(stream, monkeypatch):
    """The repair reads a given-up batch's records again (``usage.stream_records``). An empty
    page is not the end of the range: taken for it, the repair folded none of the batch and
    its message was deleted as done. On a ledger day nothing else counts those records (the
    audit re-derives only from shards)."""
    from local.gateway import LambdaContext, load_handler
    from local.streams import RepairQueue, StreamReader
    from price_keeper.store import daily_totals
    from tests.iam_check import only_granted

    tenant = new_tenant(first_shard_count=1)
    receipts = [submit(tenant) for _ in range(3)]
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    batch = reader.read()
    real_transact = daily_totals.transact
    monkeypatch.setattr(daily_totals, "transact", lambda actions: [{"Code": "TransactionConflict"}] * len(actions))
    monkeypatch.setattr(aggregation, "FOLD_ATTEMPTS", 1)
    assert deliver(batch)["batchItemFailures"]  # given up: nothing of it written
    monkeypatch.setattr(daily_totals, "transact", real_transact)
    monkeypatch.setenv("REPAIR_QUEUE_URL", "")
    queue = RepairQueue()
    queue.send_failure(reader, batch)
    (message,) = queue.sqs.receive_message(QueueUrl=queue.url)["Messages"]
    real_streams = usage.streams
    monkeypatch.setattr(usage, "streams", lambda: _EmptyPageFirst(real_streams()))
    event = {"Records": [{"eventSource": "aws:sqs", "messageId": message["MessageId"], "body": message["Body"]}]}
    with only_granted("aggregator"):
        reply = load_handler("aggregator")(event, LambdaContext("aggregator"))
    assert "batchItemFailures" not in reply  # an empty page is read past
    assert totals_of(tenant.scope) == expected(receipts)


@pytest.mark.xfail(
    strict=True,
    reason="inherent to repairing a parallelized batch by its range: so the mapping runs one batch "
    "at a time per stream shard (aggregation.USAGE_STREAM.parallelization_factor)",
)
def test_a_repair_of_one_of_a_stream_shards_parallel_batches_counts_each_record_once(stream, monkeypatch):
    """With a parallelization factor above 1, a stream shard's records go to concurrent
    batches by partition key: here one batch of the odd records (folded) and one of the even
    (given up). The on-failure message names the given-up batch by its shard's first and
    last sequence numbers, and the repair reads that range again, the odd records in it too."""
    from local.gateway import LambdaContext, load_handler
    from local.streams import RepairQueue, StreamReader
    from price_keeper.store import daily_totals
    from tests.iam_check import only_granted

    tenant = new_tenant(first_shard_count=1)
    receipts = [submit(tenant) for _ in range(4)]
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    batch = reader.read()
    assert len(batch) == 4
    odd, even = batch[1::2], batch[0::2]
    assert "batchItemFailures" not in deliver(odd)
    real_transact = daily_totals.transact
    monkeypatch.setattr(daily_totals, "transact", lambda actions: [{"Code": "TransactionConflict"}] * len(actions))
    monkeypatch.setattr(aggregation, "FOLD_ATTEMPTS", 1)
    assert deliver(even)["batchItemFailures"]
    monkeypatch.setattr(daily_totals, "transact", real_transact)
    monkeypatch.setenv("REPAIR_QUEUE_URL", "")
    queue = RepairQueue()
    queue.send_failure(reader, even)  # the range from its first record to its last: one odd record within
    (message,) = queue.sqs.receive_message(QueueUrl=queue.url)["Messages"]
    event = {"Records": [{"eventSource": "aws:sqs", "messageId": message["MessageId"], "body": message["Body"]}]}
    with only_granted("aggregator"):
        assert "batchItemFailures" not in load_handler("aggregator")(event, LambdaContext("aggregator"))
    assert totals_of(tenant.scope) == expected(receipts)


def test_a_ledger_record_whose_put_the_sdk_sent_again_is_answered_as_counted_not_as_a_duplicate(
    ledger_days, monkeypatch
):
    """A lone PutItem that DynamoDB applied but whose answer was lost is sent again by the
    SDK's retries, and cancels on the marker it wrote itself. The transaction path kept its
    ClientRequestToken for this (an SDK retry is applied at most once and answered as the
    first); the PutItem must tell its own marker from another acceptance's, or a first report
    is answered ``duplicate: true``, "not counted again"."""
    from price_keeper.store import dynamo as store_dynamo

    tenant = new_tenant(first_shard_count=1)
    real_client = store_dynamo.ddb_client()

    class AnswerLost:
        def __getattr__(self, name):
            return getattr(real_client, name)

        def put_item(self, **kwargs):
            real_client.put_item(**kwargs)  # applied; its answer lost on the way back
            return real_client.put_item(**kwargs)  # the SDK's retry of the same call

    monkeypatch.setattr(usage, "ddb_client", lambda: AnswerLost())
    reply = submit(tenant)
    assert reply["duplicate"] is False
