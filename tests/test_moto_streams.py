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
            "Item": {"shard_key": f"ORG#o#APP#a#REQ#{request_id}", "date_key": keys.DEDUP_SORT_KEY},
            "ConditionExpression": "attribute_not_exists(shard_key)",
        }
    }


def index_entry(label: str) -> dict:
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": {"shard_key": f"ORG#o#APP#a#LABEL#{label}#SH#0", "date_key": "DAY#20261126"},
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
        (record["eventName"], record["dynamodb"]["Keys"]["shard_key"]["S"], record["dynamodb"]["SequenceNumber"])
        for record in reader.event()["Records"]
    ]


def test_a_cancelled_transaction_leaves_nothing_in_the_stream(aws):
    # (moto streams an item an Update makes in a transaction twice: the shard fold sums again)
    written = list(dict.fromkeys((event, key) for event, key, _ in writes()))
    assert written == [
        ("INSERT", "ORG#o#APP#a#REQ#1"),
        ("INSERT", "ORG#o#APP#a#LABEL#premium#SH#0"),
        ("INSERT", "ORG#o#APP#a#REQ#2"),
        ("INSERT", "ORG#o#APP#a#REQ#3"),
        ("INSERT", "ORG#o#APP#a#LABEL#standard#SH#0"),
    ]


def test_the_same_writes_made_again_give_their_records_the_same_sequence_numbers(aws):
    """What the ledger's shard progress needs of a restart's replay (``domain.ledger``)."""
    first = writes()
    assert len({sequence for _, _, sequence in first}) == len(first)  # unique in the stream
    client = ddb_client()  # the table made again (a restart's), its stream new
    client.delete_table(TableName=tables.USAGE_AGG_SHARDED.physical_name)
    client.create_table(**tables.USAGE_AGG_SHARDED.create_table_kwargs())
    assert writes() == first
