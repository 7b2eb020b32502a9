"""DailyTotal: the per-label and per-scope totals the aggregator writes, its heartbeat,
and the reads of selection, aggregates and reports."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date

from . import keys, tables
from .dynamo import Read, batch_get, query_all, query_many, table, written
from .usage import COUNTERS

READ_ATTRIBUTES = (*COUNTERS, "updated_at_epoch", "last_run_epoch", "labels", "committed", "settled")


def day_read(usage_keys: Iterable[str], day: str, *, include_heartbeat: bool = False) -> Read:
    """The read of one org day's totals for ``usage_keys`` (and the heartbeat), for
    ``dynamo.batch_get_many`` beside other tables' reads."""
    wanted = [{"usage_key": usage_key, "date_key": keys.day_key(day)} for usage_key in usage_keys]
    if include_heartbeat:
        wanted.append(keys.HEARTBEAT_KEY)
    return Read(tables.DAILY_TOTAL, wanted, READ_ATTRIBUTES)


def read_current(total_keys: Iterable[dict], *, consistent: bool = False) -> dict[tuple[str, str], dict]:
    """The stored totals among ``total_keys`` by (usage_key, date_key): their counters, how
    far they have folded the shards (``source_updated_at_epoch``) and a scope total's labels."""
    return {
        (item["usage_key"], item["date_key"]): item
        for item in batch_get(
            tables.DAILY_TOTAL,
            total_keys,
            consistent=consistent,
            attributes=[*COUNTERS, "source_updated_at_epoch", "labels"],
        )
    }


def write_if_grown(usage_key: str, date_key: str, values: dict, labels: set[str]) -> bool:
    """SET ``values`` on a total unless one with as many or more ``requests`` is stored (sums
    only grow, so a slower, repeated or overlapping run never moves a total backwards), and
    ADD ``labels`` to a scope total's set; True when written."""
    update = "SET " + ", ".join(f"#{name} = :{name}" for name in values)
    bound = {f":{name}": value for name, value in values.items()}
    if labels:
        update += " ADD labels :labels"
        bound[":labels"] = labels
    return written(
        table(tables.DAILY_TOTAL).update_item,
        Key={"usage_key": usage_key, "date_key": date_key},
        UpdateExpression=update,
        ConditionExpression="attribute_not_exists(#requests) OR #requests < :requests",
        ExpressionAttributeNames={f"#{name}": name for name in values},
        ExpressionAttributeValues=bound,
    )


def register_labels(total_key: dict, labels: set[str], expires_at: int) -> set[str]:
    """ADD ``labels`` to a scope total's set (creating the item if needed); the whole set after."""
    reply = table(tables.DAILY_TOTAL).update_item(
        Key=total_key,
        UpdateExpression=f"ADD labels :labels SET {tables.TTL_ATTRIBUTE} = "
        f"if_not_exists({tables.TTL_ATTRIBUTE}, :expires)",
        ExpressionAttributeValues={":labels": labels, ":expires": expires_at},
        ReturnValues="UPDATED_NEW",
    )
    return set(reply["Attributes"]["labels"])


def put_heartbeat(now_epoch: int, lag_seconds: int) -> None:
    table(tables.DAILY_TOTAL).put_item(
        Item={
            **keys.HEARTBEAT_KEY,
            "last_run_epoch": now_epoch,
            "lag_seconds": lag_seconds,
            "updated_at_epoch": now_epoch,
        }
    )


def label_total(usage_key: str, day: str) -> dict | None:
    """One label's total of a day: cost, requests and when it was written."""
    return (
        table(tables.DAILY_TOTAL)
        .get_item(
            Key={"usage_key": usage_key, "date_key": keys.day_key(day)},
            ProjectionExpression="cost_usd_micros, requests, updated_at_epoch",
        )
        .get("Item")
    )


def days_between(usage_keys: list[str], first: date, last: date) -> list[list[dict]]:
    """Every total of each usage key from ``first`` to ``last`` inclusive, in order (one
    paginated Query per key, concurrently)."""
    return query_many(lambda client, usage_key: _days_between(client, usage_key, first, last), usage_keys)


def _days_between(client, usage_key: str, first: date, last: date) -> list[dict]:
    return query_all(
        client.query,
        TableName=tables.DAILY_TOTAL.physical_name,
        KeyConditionExpression="usage_key = :k AND date_key BETWEEN :first AND :last",
        ExpressionAttributeValues={
            ":k": usage_key,
            ":first": keys.day_key(first.strftime("%Y%m%d")),
            ":last": keys.day_key(last.strftime("%Y%m%d")),
        },
    )
