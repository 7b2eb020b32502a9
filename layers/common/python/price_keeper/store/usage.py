"""UsageAggSharded: the exactly-once usage write and the shard reads.

A record is one TransactWriteItems of two actions: Put the dedup marker
(``ORG#{org}#APP#{app}#REQ#{id}`` / ``DEDUP``, ``attribute_not_exists``) and ADD the
record's counters to its shard (``{scope}#LABEL#{label}#SH#{n}`` / ``DAY#{day}``). Both
land or neither does; a duplicate cancels on the marker, whose ``ALL_OLD`` item tells
the retry what the first acceptance counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from boto3.dynamodb.conditions import Key

from . import keys, tables
from .dynamo import batch_get, query_all, table, transact

# The counters a shard and a DailyTotal hold (they grow, but for a voided record's subtraction).
COUNTERS = (
    "cost_usd_micros",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "requests",
)


# Records voided (``domain.voids``), a shard's and a total's: it only grows, so with
# ``requests`` it gives the aggregator a generation that grows on every write, a void too
# (``daily_totals.write_if_grown``).
VOIDS = "voids"


class Conflict(Exception):
    """The write lost a race with a concurrent transaction on the same items: retry it."""


def shard_update(
    scope: str, label: str, shard_id: int, day: str, counters: dict[str, int], now_epoch: int, expires_at: int
) -> dict:
    """The ADD of ``counters`` (negative for a void) to one shard of a label, as a
    TransactWriteItems action."""
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": {"shard_key": keys.shard_key(scope, label, shard_id), "date_key": keys.day_key(day)},
            "UpdateExpression": (
                "ADD "
                + ", ".join(f"{counter} :{counter}" for counter in counters)
                + " SET updated_at_epoch = :now, active_day = if_not_exists(active_day, :day), "
                f"{tables.TTL_ATTRIBUTE} = if_not_exists({tables.TTL_ATTRIBUTE}, :expires)"
            ),
            "ExpressionAttributeValues": {
                **{f":{counter}": value for counter, value in counters.items()},
                ":now": now_epoch,
                ":day": keys.day_key(day),
                ":expires": expires_at,
            },
        }
    }


def record_items(
    *,
    dedup_key: str,
    marker: dict,
    scopes: list[str],
    label: str,
    shard_id: int,
    day: str,
    counts: dict[str, int],
    now_epoch: int,
    expires_at: int,
    marker_expires_at: int,
) -> list[dict]:
    """The actions of one record: its dedup ``marker`` (what a duplicate is answered with)
    and the ADD of its ``counts`` (every name in ``COUNTERS`` but ``requests``) to the shard
    of each of ``scopes`` (the quota scope, and in ORG scope the app's own counters)."""
    dedup = {
        "shard_key": dedup_key,
        "date_key": keys.DEDUP_SORT_KEY,
        **marker,
        "accepted_at_epoch": now_epoch,
        tables.TTL_ATTRIBUTE: marker_expires_at,
    }
    counters = {counter: {**counts, "requests": 1}[counter] for counter in COUNTERS}
    return [
        {
            "Put": {
                "TableName": tables.USAGE_AGG_SHARDED.physical_name,
                "Item": dedup,
                "ConditionExpression": "attribute_not_exists(shard_key)",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        },
        *(shard_update(scope, label, shard_id, day, counters, now_epoch, expires_at) for scope in scopes),
    ]


def request_token(items: list[dict], attempt: int) -> str:
    """ClientRequestToken: the same for SDK retries of one call (which DynamoDB then applies
    at most once), new for each attempt after a conflict (which must run again)."""
    digest = hashlib.blake2b(json.dumps([items, attempt], sort_keys=True, default=str).encode(), digest_size=16)
    return digest.hexdigest()


def write_once(items: list[dict], attempt: int) -> dict | None:
    """Write one record's ``record_items``: None when this write counted it, the first
    acceptance's marker when its request id was counted before; ``Conflict`` to retry."""
    reasons = transact(items, ClientRequestToken=request_token(items, attempt))
    if reasons is None:
        return None
    if reasons[0].get("Code") == "ConditionalCheckFailed":
        return reasons[0].get("Item", {})  # (none when a void's marker is gone)
    raise Conflict()


def read_marker(dedup_key: str) -> dict | None:
    """A record's dedup marker (strongly consistent): what it counted, where, and whether it was voided."""
    return (
        table(tables.USAGE_AGG_SHARDED)
        .get_item(Key={"shard_key": dedup_key, "date_key": keys.DEDUP_SORT_KEY}, ConsistentRead=True)
        .get("Item")
    )


def void_items(
    *,
    dedup_key: str,
    marker: dict,
    scopes: list[str],
    counters: dict[str, int],
    now_epoch: int,
    expires_at: int,
    reason: str,
) -> list[dict]:
    """The actions of one void, for ``write_once``: mark the record voided (only once: the
    condition fails on a marker already voided or gone) and ADD ``counters`` (the record's,
    negated, and ``voids`` 1) to the shard of each scope it was counted in."""
    mark = {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": {"shard_key": dedup_key, "date_key": keys.DEDUP_SORT_KEY},
            "UpdateExpression": "SET voided_at_epoch = :now, void_reason = :reason",
            "ConditionExpression": "attribute_exists(shard_key) AND attribute_not_exists(voided_at_epoch)",
            "ExpressionAttributeValues": {":now": now_epoch, ":reason": reason},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }
    label, shard_id, day = marker["model_label"], int(marker["shard_id"]), marker["org_day"]
    return [mark, *(shard_update(scope, label, shard_id, day, counters, now_epoch, expires_at) for scope in scopes)]


def org_has_spend(org_id: str, day: str) -> bool:
    """Whether any scope of the org (the org's or an app's) has a shard on ``day``: one
    Query of the ``active-by-day`` index, ``begins_with ORG#{org}#``, at most one key."""
    index = tables.ACTIVE_BY_DAY
    found = table(tables.USAGE_AGG_SHARDED).query(
        IndexName=index.name,
        Limit=1,
        KeyConditionExpression=Key(index.partition_key).eq(keys.day_key(day))
        & Key(index.sort_key).begins_with(keys.org_key(org_id) + "#"),
    )
    return bool(found["Items"])


def active_shard_keys(day: str) -> list[dict]:
    """Keys of the shards written for org day ``day`` (``yyyymmdd``), from the sparse GSI."""
    index = tables.ACTIVE_BY_DAY
    items = query_all(
        table(tables.USAGE_AGG_SHARDED).query,
        IndexName=index.name,
        KeyConditionExpression=Key(index.partition_key).eq(keys.day_key(day)),
    )
    return [{"shard_key": item["shard_key"], "date_key": item["date_key"]} for item in items]


def read_shards(shard_keys: Iterable[dict], attributes: Iterable[str], *, consistent: bool = False) -> list[dict]:
    """The existing shards among ``shard_keys`` (any number; BatchGetItem)."""
    return batch_get(tables.USAGE_AGG_SHARDED, shard_keys, attributes=attributes, consistent=consistent)


def label_spends(scope: str, labels: Iterable[str], day: str, shard_count: int) -> dict[str, int]:
    """``cost_usd_micros`` of each label of ``scope`` on ``day`` summed over its shards; 0 for
    a label with no shard yet: live spend, for model selection in tight mode.

    DailyTotal lags the shards until the aggregator folds them. Near a quota that lag is
    what a burst overspends, so tight mode reads the shards themselves: one BatchGetItem of
    labels x shards (e.g. 3 labels x 8 shards = 24 keys, ~12 read units eventually
    consistent, vs 1.5 for the totals). ``benchmarks/overshoot.py`` measures what it buys.
    """
    labels = list(labels)
    wanted = [key for label in labels for key in keys.shard_item_keys(scope, label, keys.day_key(day), shard_count)]
    spends = dict.fromkeys(labels, 0)
    for item in read_shards(wanted, ["cost_usd_micros"]):
        spends[keys.label_of_shard(item["shard_key"])] += int(item.get("cost_usd_micros", 0))
    return spends
