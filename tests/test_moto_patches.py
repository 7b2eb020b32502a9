"""moto's answers written without its output-model walk (``local/moto_patches._answer``) are
the ones the walk writes: every kind of DynamoDB answer the service gets, compared field by
field, binaries, sets, nested maps and paging keys included."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from boto3.dynamodb.types import Binary
from moto.dynamodb.responses import DynamoHandler

from price_keeper.store import tables
from price_keeper.store.dynamo import ddb_client

TABLE = tables.DAILY_TOTAL.physical_name


@pytest.fixture
def both_answers(aws, monkeypatch):
    """Each DynamoDB answer as ``_answer`` writes it and as moto's own serializer does."""
    answers: list[tuple[str, dict, dict]] = []
    fast = DynamoHandler.serialized

    def compared(self, action_result):
        status, headers, body = fast(self, action_result)
        walked = fast.__wrapped__(self, action_result)
        answers.append((self._get_action(), json.loads(body or "{}"), json.loads(walked[2] or "{}")))
        assert (status, headers["Content-Type"]) == (walked[0], walked[1]["Content-Type"])
        return status, headers, body

    monkeypatch.setattr(DynamoHandler, "serialized", compared)
    return answers


def key(n: int) -> dict:
    return {"usage_key": f"ORG#o#LABEL#l{n}", "date_key": "20261129"}


def test_every_kind_of_answer_is_the_one_the_output_model_walk_writes(both_answers):
    client = ddb_client()
    item = {
        **key(0),
        "cost": Decimal("12345678901234567890"),
        "blob": Binary(b"\x00\xffbinary"),
        "names": {"a", "b"},
        "counts": {Decimal(1), Decimal("2.5")},
        "blobs": {Binary(b"x"), Binary(b"y")},
        "nested": {"list": ["x", None, False, {}]},
    }
    client.put_item(TableName=TABLE, Item=item, ReturnConsumedCapacity="TOTAL")
    client.put_item(TableName=TABLE, Item=item, ReturnValues="ALL_OLD")
    for n in range(1, 4):
        client.put_item(TableName=TABLE, Item={**key(n), "cost": n})
    client.get_item(TableName=TABLE, Key=key(0), ReturnConsumedCapacity="INDEXES")
    client.get_item(TableName=TABLE, Key=key(9))  # no item
    client.update_item(
        TableName=TABLE,
        Key=key(1),
        UpdateExpression="ADD cost :one SET seen = :now",
        ExpressionAttributeValues={":one": 1, ":now": 1764400000},
        ReturnValues="ALL_NEW",
    )
    client.delete_item(TableName=TABLE, Key=key(2), ReturnValues="ALL_OLD")
    client.delete_item(TableName=TABLE, Key=key(8))
    client.query(
        TableName=TABLE,
        KeyConditionExpression="usage_key = :pk",
        ExpressionAttributeValues={":pk": "ORG#o#LABEL#l0"},
        ReturnConsumedCapacity="TOTAL",
    )
    client.scan(TableName=TABLE, Limit=1)  # a page with LastEvaluatedKey
    client.batch_get_item(RequestItems={TABLE: {"Keys": [key(0), key(3), key(7)]}}, ReturnConsumedCapacity="TOTAL")
    client.batch_write_item(RequestItems={TABLE: [{"PutRequest": {"Item": key(5)}}]})
    client.transact_write_items(
        TransactItems=[{"Put": {"TableName": TABLE, "Item": key(6)}}], ReturnConsumedCapacity="TOTAL"
    )
    client.transact_get_items(TransactItems=[{"Get": {"TableName": TABLE, "Key": key(0)}}])
    with pytest.raises(client.exceptions.TransactionCanceledException):
        client.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": TABLE, "Item": key(6), "ConditionExpression": "attribute_not_exists(usage_key)"}}
            ]
        )

    kinds = {kind for kind, _, _ in both_answers}
    assert kinds >= {"PutItem", "GetItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem"}
    assert kinds >= {"BatchWriteItem", "TransactWriteItems", "TransactGetItems"}
    for kind, written, walked in both_answers:
        assert written == walked, kind
    assert any("LastEvaluatedKey" in written for _, written, _ in both_answers)
    assert any(written.get("Item", {}).get("blob") == {"B": "AP9iaW5hcnk="} for _, written, _ in both_answers)
