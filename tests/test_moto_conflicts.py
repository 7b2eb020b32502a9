"""The fleet benchmark's model of DynamoDB's transaction conflicts (``local/moto_patches``):
an item a transaction wrote is held for a while, and what touches it meanwhile is refused
as DynamoDB refuses it. Time is the test's own clock."""

import threading
import time

import pytest
from botocore.exceptions import ClientError

from price_keeper.store import tables
from price_keeper.store.dynamo import ddb_client


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


def put(name: str) -> dict:
    return {"TableName": tables.DAILY_TOTAL.physical_name, "Item": {**item(name), "requests": 0}}


def requests(name: str) -> int:
    found = ddb_client().get_item(TableName=tables.DAILY_TOTAL.physical_name, Key=item(name), ConsistentRead=True)
    return int(found.get("Item", {}).get("requests", 0))


def test_what_touches_an_item_a_transaction_in_flight_holds_is_refused_and_changes_nothing(clock):
    client = ddb_client()
    clock.answer.clear()  # the first transaction is in flight until the test lets it answer
    first = threading.Thread(target=client.transact_write_items, kwargs={"TransactItems": [add_one("a"), add_one("b")]})
    first.start()
    while requests("a") == 0:  # written (moto applies it at once), not answered yet
        time.sleep(0.001)
    with pytest.raises(ClientError) as cancelled:
        client.transact_write_items(TransactItems=[add_one("c"), add_one("b")])
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert [reason["Code"] for reason in cancelled.value.response["CancellationReasons"]] == [
        "None",
        "TransactionConflict",
    ]
    for write in (lambda: client.update_item(**add_one("a")["Update"]), lambda: client.put_item(**put("b"))):
        with pytest.raises(ClientError) as refused:
            write()
        assert refused.value.response["Error"]["Code"] == "TransactionConflictException"
    client.update_item(**add_one("c")["Update"])  # a single write of a free item, meanwhile
    assert (requests("a"), requests("b"), requests("c")) == (1, 1, 1)
    clock.answer.set()
    first.join(10)
    client.transact_write_items(TransactItems=[add_one("c"), add_one("b")])  # over: free again
    assert (requests("b"), requests("c")) == (2, 2)


def test_a_callers_next_transaction_never_conflicts_with_its_own_last_one(clock):
    """Its answer comes once the transaction is over (review note: the model first held the
    items after answering, so one client's back-to-back writes conflicted)."""
    client = ddb_client()
    for _ in range(3):
        client.transact_write_items(TransactItems=[add_one("a")])
        client.update_item(**add_one("a")["Update"])
    assert requests("a") == 6


def test_a_transaction_cancelled_by_its_condition_holds_nothing(clock):
    client = ddb_client()
    refused = {**add_one("a")["Update"], "ConditionExpression": "attribute_exists(requests)"}
    with pytest.raises(ClientError):
        client.transact_write_items(TransactItems=[{"Update": refused}])
    client.update_item(**add_one("a")["Update"])
    assert requests("a") == 1
