"""StickyState, alert records: one item per alert a scope fired on an org day
(``ALERT#{day}#{type}#{subject}#{threshold}``), claimed, then marked published."""

from __future__ import annotations

from . import keys, tables
from .dynamo import ConditionFailed, conditional, ddb_client, query_all, query_many, written


def of_day(scope: str, day: str) -> dict[str, dict]:
    """The scope's records of the day by date_key (one Query)."""
    return _of_day(ddb_client(), scope, day)


def of_day_many(scopes: list[str], day: str) -> list[dict]:
    """The records of the day of every scope (one Query per scope, concurrently)."""
    return [
        item
        for found in query_many(lambda client, scope: _of_day(client, scope, day).values(), scopes)
        for item in found
    ]


def _of_day(client, scope: str, day: str) -> dict[str, dict]:
    items = query_all(
        client.query,
        TableName=tables.STICKY_STATE.physical_name,
        KeyConditionExpression="scope_key = :s AND begins_with(date_key, :p)",
        ExpressionAttributeValues={":s": scope, ":p": keys.alert_prefix(day)},
    )
    return {item["date_key"]: item for item in items}


def create(item: dict) -> bool:
    """Write a new record; False when another run recorded the alert first."""
    return written(
        ddb_client().put_item,
        TableName=tables.STICKY_STATE.physical_name,
        Item=item,
        ConditionExpression="attribute_not_exists(date_key)",
    )


def claim(item: dict, now_epoch: int) -> dict | None:
    """Take over an unpublished record still claimed as ``item`` saw it; the record when ours."""
    try:
        return conditional(
            ddb_client().update_item,
            TableName=tables.STICKY_STATE.physical_name,
            Key={"scope_key": item["scope_key"], "date_key": item["date_key"]},
            UpdateExpression="SET claimed_at_epoch = :now ADD attempts :one",
            ConditionExpression="published = :false AND claimed_at_epoch = :seen",
            ExpressionAttributeValues={
                ":now": now_epoch,
                ":one": 1,
                ":false": False,
                ":seen": item["claimed_at_epoch"],
            },
            ReturnValues="ALL_NEW",
        )["Attributes"]
    except ConditionFailed:
        return None


def mark_published(item: dict, now_epoch: int) -> None:
    ddb_client().update_item(
        TableName=tables.STICKY_STATE.physical_name,
        Key={"scope_key": item["scope_key"], "date_key": item["date_key"]},
        UpdateExpression="SET published = :true, published_at_epoch = :now",
        ExpressionAttributeValues={":true": True, ":now": now_epoch},
    )
