"""moto's usage stream as the ledger needs it (``local/moto_patches``): a cancelled
transaction leaves nothing in the stream, as on DynamoDB, and a record's sequence number is
the same whenever the same writes are made again in the same order (a replayed journal)."""

from __future__ import annotations

import pytest

from local.streams import StreamReader
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import ddb_client


def marker(request_id: str) -> dict:
    return {
        "Put": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Item": keys.marker_key("o", "a", request_id, 8),
            "ConditionExpression": "attribute_not_exists(shard_key)",
        }
    }


def index_entry(label: str) -> dict:
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": keys.day_entry_key("ORG#o#APP#a", label, "20261126"),
            "UpdateExpression": "SET updated_at_epoch = :now",
            "ExpressionAttributeValues": {":now": 1},
        }
    }


def writes() -> list[tuple[str, str, str]]:
    """Two records, then one whose transaction is cancelled (its marker was written
    before), then the last: the stream as the fold reads it."""
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    client = ddb_client()
    client.transact_write_items(TransactItems=[marker("1"), index_entry("premium")])
    client.transact_write_items(TransactItems=[marker("2")])
    with pytest.raises(client.exceptions.TransactionCanceledException):
        client.transact_write_items(TransactItems=[index_entry("standard"), marker("1")])
    client.transact_write_items(TransactItems=[marker("3"), index_entry("standard")])
    return [
        (record["eventName"], _name(record["dynamodb"]["Keys"]), record["dynamodb"]["SequenceNumber"])
        for record in reader.event()["Records"]
    ]


def _name(item_keys: dict) -> str:
    """A marker by its request id, an index entry by its label."""
    return (
        item_keys["date_key"]["S"].rsplit("#", 1)[-1]
        if item_keys["date_key"]["S"].startswith("APP#")
        else (item_keys["shard_key"]["S"].rsplit("#", 1)[-1])
    )


def test_a_cancelled_transaction_leaves_nothing_in_the_stream(aws):
    # (moto streams an item an Update makes in a transaction twice)
    written = list(dict.fromkeys((event, key) for event, key, _ in writes()))
    assert written == [("INSERT", "1"), ("INSERT", "premium"), ("INSERT", "2"), ("INSERT", "3"), ("INSERT", "standard")]


def test_the_same_writes_made_again_give_their_records_the_same_sequence_numbers(aws):
    """What the ledger's shard progress needs of a restart's replay (``domain.ledger``)."""
    first = writes()
    assert len({sequence for _, _, sequence in first}) == len(first)  # unique in the stream
    client = ddb_client()  # the table made again (a restart's), its stream new
    client.delete_table(TableName=tables.USAGE_AGG_SHARDED.physical_name)
    client.create_table(**tables.USAGE_AGG_SHARDED.create_table_kwargs())
    assert writes() == first
