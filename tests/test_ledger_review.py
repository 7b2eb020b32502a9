"""A review of the ledger path (``domain.ledger``): deliveries and writes that lost or
double-counted records, or got a fold stuck."""

from __future__ import annotations

from price_keeper.domain import aggregation, ledger
from price_keeper.store import dynamo, usage
from tests.test_ledger import (  # noqa: F401 - fixtures
    _records,
    deliver,
    expected,
    stream,
    submit,
    totals_of,
)
from tests.usage_support import new_tenant


def test_a_chunk_delivered_again_from_its_first_record_ever_longer_is_not_stuck(stream, monkeypatch):
    """Each delivery of a batch from the same first record, one record longer (a resumed
    batch that gained the stream's newer records), finds most of it folded. What was folded
    is no failed write: it must not use up the chunk's attempts, or from the
    ``FOLD_ATTEMPTS``-th extension on the chunk could never be written again."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    tenant = new_tenant()
    receipts = [submit(tenant) for _ in range(aggregation.FOLD_ATTEMPTS + 2)]
    batch = stream()
    assert len(ledger.changes(_records(batch))) == len(receipts)
    for end in range(1, len(batch) + 1):
        assert "batchItemFailures" not in deliver(batch[:end]), f"stuck at a delivery of {end} records"
    assert totals_of(tenant.scope) == expected(receipts)


def test_a_ledger_record_whose_put_the_sdk_sent_again_is_answered_as_counted_not_as_a_duplicate(aws, monkeypatch):
    """A lone PutItem that DynamoDB applied but whose answer was lost is sent again by the
    SDK's retries, and cancels on the marker it wrote itself. The transaction path kept its
    ClientRequestToken for this (an SDK retry is applied at most once and answered as the
    first); the PutItem must tell its own marker from another acceptance's, or a first report
    is answered ``duplicate: true``, "not counted again"."""
    from price_keeper.store import dynamo as store_dynamo

    tenant = new_tenant()
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
