"""The fleet benchmark's model of DynamoDB's transaction conflicts (``local/moto_patches``):
an item a transaction wrote is held for a while, and what touches it meanwhile is refused
as DynamoDB refuses it. Time is the test's own clock."""

from types import SimpleNamespace

import pytest
from botocore.exceptions import ClientError
from moto.dynamodb.responses import DynamoHandler

from local import moto_patches
from price_keeper.store import tables
from price_keeper.store.dynamo import ddb_client

HOLD_SECONDS = 0.01


@pytest.fixture
def clock(aws, monkeypatch):
    """Conflicts modelled on this process's moto (undone afterwards), on a clock the test moves."""
    for name in ("transact_write_items", "put_item", "update_item", "delete_item"):
        monkeypatch.setattr(DynamoHandler, name, getattr(DynamoHandler, name))
    now = [1000.0]
    monkeypatch.setattr(moto_patches, "time", SimpleNamespace(monotonic=lambda: now[0]))
    moto_patches.model_conflicts(DynamoHandler, HOLD_SECONDS)
    return now


def item(name: str) -> dict:
    return {"usage_key": name, "date_key": "DAY#20261126"}


def add_one(name: str) -> dict:
    return {
        "Update": {
            "TableName": tables.DAILY_TOTAL.physical_name,
            "Key": item(name),
            "UpdateExpression": "ADD requests :one",
            "ExpressionAttributeValues": {":one": 1},
        }
    }


def requests(name: str) -> int:
    found = ddb_client().get_item(TableName=tables.DAILY_TOTAL.physical_name, Key=item(name), ConsistentRead=True)
    return int(found.get("Item", {}).get("requests", 0))


def test_a_transaction_touching_an_item_another_holds_is_cancelled_for_it_and_changes_nothing(clock):
    client = ddb_client()
    client.transact_write_items(TransactItems=[add_one("a"), add_one("b")])
    clock[0] += HOLD_SECONDS / 2
    with pytest.raises(ClientError) as cancelled:
        client.transact_write_items(TransactItems=[add_one("c"), add_one("b")])
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert [reason["Code"] for reason in cancelled.value.response["CancellationReasons"]] == [
        "None",
        "TransactionConflict",
    ]
    assert (requests("b"), requests("c")) == (1, 0)
    clock[0] += HOLD_SECONDS
    client.transact_write_items(TransactItems=[add_one("c"), add_one("b")])
    assert (requests("b"), requests("c")) == (2, 1)


def test_a_single_write_of_a_held_item_fails_with_transaction_conflict_and_one_of_a_free_item_does_not(clock):
    client = ddb_client()
    client.transact_write_items(TransactItems=[add_one("a")])
    with pytest.raises(ClientError) as refused:
        client.update_item(**add_one("a")["Update"])
    assert refused.value.response["Error"]["Code"] == "TransactionConflictException"
    with pytest.raises(ClientError) as refused:
        client.put_item(TableName=tables.DAILY_TOTAL.physical_name, Item=item("a"))
    assert refused.value.response["Error"]["Code"] == "TransactionConflictException"
    client.update_item(**add_one("b")["Update"])  # a single write holds nothing
    client.transact_write_items(TransactItems=[add_one("b")])
    clock[0] += HOLD_SECONDS * 2
    client.update_item(**add_one("a")["Update"])
    assert (requests("a"), requests("b")) == (2, 2)


def test_a_transaction_cancelled_by_its_condition_holds_nothing(clock):
    client = ddb_client()
    refused = {**add_one("a")["Update"], "ConditionExpression": "attribute_exists(requests)"}
    with pytest.raises(ClientError):
        client.transact_write_items(TransactItems=[{"Update": refused}])
    client.update_item(**add_one("a")["Update"])
    assert requests("a") == 1
