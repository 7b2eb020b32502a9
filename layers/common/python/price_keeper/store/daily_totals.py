"""DailyTotal: the per-label and per-scope totals the aggregator writes, its heartbeat,
and the reads of selection, aggregates and reports."""
from __future__ import annotations

from datetime import date
from typing import Iterable

from .. import keys, tables
from .dynamo import Read, batch_get, query_all, query_many, table, written
from .usage import COUNTERS

READ_ATTRIBUTES = (*COUNTERS, "updated_at_epoch", "last_run_epoch", "labels")


def day_read(usage_keys: Iterable[str], day: str, *, include_heartbeat: bool = False) -> Read:
    """The read of one org day's totals for ``usage_keys`` (and the heartbeat), for
    ``dynamo.batch_get_many`` beside other tables' reads."""
    wanted = [{"usage_key": usage_key, "date_key": keys.day_key(day)} for usage_key in usage_keys]
    if include_heartbeat:
        wanted.append(keys.HEARTBEAT_KEY)
    return Read(tables.DAILY_TOTAL, wanted, READ_ATTRIBUTES)


def read_current(total_keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """The stored totals among (usage_key, date_key) pairs: their counters and how far
    they have folded the shards (``source_updated_at_epoch``)."""
    return {(item["usage_key"], item["date_key"]): item
            for item in batch_get(tables.DAILY_TOTAL, [{"usage_key": u, "date_key": d} for u, d in total_keys],
                                  attributes=[*COUNTERS, "source_updated_at_epoch"])}


def put_if_grown(item: dict) -> bool:
    """Write a total unless one with as many or more requests is stored (sums only grow,
    so a slower, overlapping run never moves a total backwards); True when written."""
    return written(table(tables.DAILY_TOTAL).put_item,
                   Item=item, ConditionExpression="attribute_not_exists(usage_key) OR requests < :requests",
                   ExpressionAttributeValues={":requests": item["requests"]})


def put_heartbeat(now_epoch: int, lag_seconds: int) -> None:
    table(tables.DAILY_TOTAL).put_item(Item={**keys.HEARTBEAT_KEY, "last_run_epoch": now_epoch,
                                             "lag_seconds": lag_seconds, "updated_at_epoch": now_epoch})


def label_total(usage_key: str, day: str) -> dict | None:
    """One label's total of a day: cost, requests and when it was written."""
    return table(tables.DAILY_TOTAL).get_item(
        Key={"usage_key": usage_key, "date_key": keys.day_key(day)},
        ProjectionExpression="cost_usd_micros, requests, updated_at_epoch").get("Item")


def days_between(usage_keys: list[str], first: date, last: date) -> list[list[dict]]:
    """Every total of each usage key from ``first`` to ``last`` inclusive, in order (one
    paginated Query per key, concurrently)."""
    return query_many(lambda client, usage_key: _days_between(client, usage_key, first, last), usage_keys)


def _days_between(client, usage_key: str, first: date, last: date) -> list[dict]:
    return query_all(
        client.query,
        TableName=tables.DAILY_TOTAL.physical_name,
        KeyConditionExpression="usage_key = :k AND date_key BETWEEN :first AND :last",
        ExpressionAttributeValues={":k": usage_key, ":first": keys.day_key(first.strftime("%Y%m%d")),
                                   ":last": keys.day_key(last.strftime("%Y%m%d"))},
    )
