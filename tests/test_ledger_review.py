"""A review of the ledger path (``domain.ledger``): deliveries, repairs and stream reads
that lost or double-counted records, or got a fold stuck."""

from __future__ import annotations

from price_keeper.domain import aggregation, ledger
from price_keeper.store import dynamo
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
