"""UsageAggSharded: the exactly-once usage write.

A record is its dedup marker (``keys.marker_key``: ``ORG#{org}#MARKERS#{bucket}`` /
``APP#{app}#REQ#{id}``), put with ``attribute_not_exists``: a duplicate cancels on it, and
its ``ALL_OLD`` item tells the retry what the first acceptance counted. The aggregator
folds the markers' inserts and updates from the table's stream (``domain.ledger``); a void
or a re-pricing is an update of the marker alone. A record written with something beside
its marker (the label-day's index entry, an estimated item, a settlement) is one
TransactWriteItems, all or nothing; a batch's records share them (``group_items``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator

from boto3.dynamodb.conditions import Key
from botocore.exceptions import ClientError

from . import keys, tables
from .dynamo import (
    ConditionFailed,
    conditional,
    ddb_client,
    query_many,
    query_pages,
    table,
    transact,
)

# Re-pricings folded into a total: a correction changes the cost without a new request.
CORRECTIONS = "repriced"
# The counters a DailyTotal holds (they only ever grow, but for a re-priced record's
# correction, see ``reprice_once``, and a voided record's subtraction).
COUNTERS = (
    "cost_usd_micros",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "requests",
)


# The cost of records that settled a reservation (``domain.reservations``), a marker's and a
# total's: folded with the record, so a reader knows how much of the settled
# spend its totals already hold (``aggregation.Totals.unreserved``).
SETTLED = "settled_usd_micros"

# Records voided (``domain.voids``), a total's: it only grows.
VOIDS = "voids"


MAX_TRANSACTION_ACTIONS = 100  # TransactWriteItems' limit

# On a marker written by a lone PutItem: the call that wrote it (``write_group``).
PUT_BY = "put_by"
# On a marker written while its label-day was tight: its cost was ADDed to one of the
# label-day's live items first (``add_live``), and the fold takes it back (``domain.ledger``).
LIVE = "live"


class Conflict(Exception):
    """The write was cancelled for a reason other than a counted request id (a concurrent
    transaction on one of its items, throttling, or a failed condition of an action appended
    to the record, e.g. a reservation's settlement): retry it."""

    def __init__(self, reasons: list[dict]):
        codes = {reason.get("Code") for reason in reasons}
        super().__init__(", ".join(sorted(code for code in codes if code and code != "None")))


def day_listed(scope: str, label: str, day: str, now_epoch: int, expires_at: int) -> dict:
    """A label-day's entry in the ``active-by-day`` index (``keys.day_entry_key``), as a
    TransactWriteItems action of its first records (before its total exists) and its first
    fold: what ``org_has_spend`` and the audit find the day's label-days by."""
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": keys.day_entry_key(scope, label, day),
            "UpdateExpression": (
                "SET active_day = if_not_exists(active_day, :day), updated_at_epoch = :now, "
                f"{tables.TTL_ATTRIBUTE} = if_not_exists({tables.TTL_ATTRIBUTE}, :expires)"
            ),
            "ExpressionAttributeValues": {
                ":day": keys.active_day_key(day, keys.split_scope(scope)[0]),
                ":now": now_epoch,
                ":expires": expires_at,
            },
        }
    }


LiveItem = tuple[str, str, int]  # (usage key, yyyymmdd, part): one of a label-day's live items


def add_live(costs: dict[LiveItem, int], expires_at: int) -> None:
    """ADD each cost (negative: taken back) to its live item (``keys.live_part``), one
    UpdateItem each, never in a transaction: single writes to one item queue, where
    transactions on it would cancel each other (a hot label in tight mode)."""
    for (usage_key, day, part), cost in costs.items():
        table(tables.DAILY_TOTAL).update_item(
            Key={"usage_key": usage_key, "date_key": keys.live_day_key(day, part)},
            UpdateExpression="ADD cost_usd_micros :c SET #ttl = if_not_exists(#ttl, :e)",
            ExpressionAttributeNames={"#ttl": tables.TTL_ATTRIBUTE},
            ExpressionAttributeValues={":c": cost, ":e": expires_at},
        )


def live_costs_of(records: list[dict]) -> dict[LiveItem, int]:
    """The cost each live item takes of ``records`` (``group_items``' records) that are tight."""
    costs: dict[LiveItem, int] = {}
    for record in records:
        if record.get("live"):
            where = _live_item(record)
            costs[where] = costs.get(where, 0) + record["counts"]["cost_usd_micros"]
    return costs


def group_items(records: list[dict]) -> list[dict]:
    """The actions of records written in one transaction (one, or a batch's). Per record:
    its dedup ``marker`` (what a duplicate is answered with; ``marker_key``, ``now_epoch``,
    ``marker_expires_at``) and, for one counted at the estimate, its ``estimated`` item
    (``model_id`` and what re-pricing needs, written once with the record since the marker
    is); once per transaction, a new label-day's index entry (``lists_day``). The markers come
    first, in the order of ``records``, so a cancellation reason's index names its record. (A
    tight record's live cost is added before, on its own: ``add_live``.)"""
    now_epoch, expires_at = max(r["now_epoch"] for r in records), max(r["expires_at"] for r in records)
    return [
        *(_marker_put(record) for record in records),
        *(_estimated_put(record) for record in records if record.get("estimated")),
        *(day_listed(*where, now_epoch, expires_at) for where in sorted(_days_listed(records))),
    ]


def _live_item(record: dict) -> LiveItem:
    """The live item (usage key, day, part) a tight record ADDs its cost to."""
    return keys.usage_key(record["scopes"][0], record["label"]), record["day"], keys.live_part(record["marker_key"])


def _days_listed(records: list[dict]) -> set[tuple[str, str, str]]:
    """The (scope, label, day) whose index entries ``records`` put (``day_listed``)."""
    return {(r["scopes"][0], r["label"], r["day"]) for r in records if r.get("lists_day")}


def group_size(records: list[dict]) -> int:
    """How many actions ``group_items`` makes of ``records`` (a transaction takes 100)."""
    estimated = sum(1 for r in records if r.get("estimated"))
    return len(records) + len(_days_listed(records)) + estimated


def _marker_put(record: dict) -> dict:
    item = {
        **record["marker_key"],
        **record["marker"],
        **({LIVE: 1} if record.get("live") else {}),
        "accepted_at_epoch": record["now_epoch"],
        tables.TTL_ATTRIBUTE: record["marker_expires_at"],
    }
    return {
        "Put": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(shard_key)",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _estimated_put(record: dict) -> dict:
    """The item re-pricing finds a record counted at the estimate by (``estimated_records``)."""
    pending = {
        **record["estimated"],
        "shard_key": keys.estimated_key(record["estimated"]["model_id"]),
        "date_key": record["dedup_key"],
        "marker_key": record["marker_key"],
        "scopes": record["scopes"],
        "model_label": record["label"],
        "org_day": record["day"],
        "cost_usd_micros": record["counts"]["cost_usd_micros"],
        tables.TTL_ATTRIBUTE: record["expires_at"],
    }
    return {"Put": {"TableName": tables.USAGE_AGG_SHARDED.physical_name, "Item": pending}}


# Keys this process's request tokens: two containers writing the same record in the same
# second (a client's retry on another container) build the same
# actions, and with the same token DynamoDB would answer the second as an idempotent repeat
# of the first: a success, so a duplicate answered as counted (a red-team note).
_TOKEN_KEY = secrets.token_bytes(16)


def request_token(items: list[dict], attempt: int) -> str:
    """ClientRequestToken: the same for SDK retries of one call (which DynamoDB then applies
    at most once), new for each attempt after a conflict (which must run again) and in each
    process."""
    text = json.dumps([items, attempt], sort_keys=True, default=str).encode()
    return hashlib.blake2b(text, key=_TOKEN_KEY, digest_size=16).hexdigest()


def write_once(items: list[dict], attempt: int) -> dict | None:
    """``write_group`` of one record whose marker is ``items[0]`` (a void's): None when this
    write applied it, else the marker as it was (empty when it is gone); ``Conflict`` to retry."""
    counted_before = write_group(items, 1, attempt)
    return counted_before[0] if counted_before else None


def write_group(items: list[dict], records: int, attempt: int) -> dict[int, dict]:
    """Write ``items`` whose first ``records`` actions are markers (``group_items``, then
    any others, e.g. a settlement's): {} when it counted every record; else
    nothing was written, and the records (by index) whose request id was counted before,
    each with the first acceptance's marker: write the others again. ``Conflict`` to retry."""
    if len(items) == 1 and "Put" in items[0]:  # a ledger record alone: its marker, one PutItem (a transaction's half)
        # Marked as this call's: an SDK retry of a PutItem applied but whose answer was lost
        # cancels on the marker it wrote itself, which is no duplicate (the transactions'
        # ClientRequestToken does this for theirs).
        mine = secrets.token_hex(8)
        put = {**items[0]["Put"], "Item": {**items[0]["Put"]["Item"], PUT_BY: mine}}
        try:
            conditional(ddb_client().put_item, **put)
            return {}
        except ConditionFailed as failed:
            first = failed.item or {}
            return {} if first.get(PUT_BY) == mine else {0: first}
    reasons = transact(items, ClientRequestToken=request_token(items, attempt))
    if reasons is None:
        return {}
    counted = {
        index: reason.get("Item", {})
        for index, reason in enumerate(reasons[:records])
        if reason.get("Code") == "ConditionalCheckFailed"
    }
    if counted:
        return counted
    raise Conflict(reasons)


def read_marker(marker_key: dict) -> dict | None:
    """A record's dedup marker (strongly consistent): what it counted, where, and whether it was voided."""
    return table(tables.USAGE_AGG_SHARDED).get_item(Key=marker_key, ConsistentRead=True).get("Item")


def org_markers(org_id: str, buckets: int) -> Iterator[dict]:
    """Every usage marker of an org (of the last ``dedup_ttl_days``), read by key: a Query
    of each of its ``buckets`` partition keys (``keys.marker_key``), a page at a time."""
    for bucket in range(buckets):
        for page in query_pages(
            table(tables.USAGE_AGG_SHARDED).query,
            KeyConditionExpression=Key("shard_key").eq(keys.markers_partition(org_id, bucket)),
        ):
            yield from page


def void_mark(marker_key: dict, marker: dict, now_epoch: int, reason: str) -> dict:
    """A void's update of the record's marker, for ``write_once``: voided only once (the
    condition fails on a marker already voided or gone, or re-priced since ``marker`` was
    read); the fold takes its counts back from the marker's images."""
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": marker_key,
            "UpdateExpression": "SET voided_at_epoch = :now, void_reason = :reason",
            "ConditionExpression": (
                "attribute_exists(shard_key) AND attribute_not_exists(voided_at_epoch) AND cost_usd_micros = :read"
            ),
            "ExpressionAttributeValues": {":now": now_epoch, ":reason": reason, ":read": marker["cost_usd_micros"]},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def org_has_spend(org_id: str, day: str) -> bool:
    """Whether any scope of the org (the org's or an app's) has a label-day on ``day``: a
    Query of the ``active-by-day`` index under the org's bucket, ``begins_with ORG#{org}#``,
    at most one key."""
    index = tables.ACTIVE_BY_DAY
    found = table(tables.USAGE_AGG_SHARDED).query(
        IndexName=index.name,
        Limit=1,
        KeyConditionExpression=Key(index.partition_key).eq(keys.active_day_key(day, org_id))
        & Key(index.sort_key).begins_with(keys.org_key(org_id) + "#"),
    )
    return bool(found["Items"])


def active_label_day_pages(active_day: str, client=None) -> Iterator[list[dict]]:
    """Index entries (``day_listed``) under one ``active-by-day`` partition key
    (``keys.active_day_keys``), a Query page at a time."""
    index = tables.ACTIVE_BY_DAY
    pages = query_pages(
        (client or ddb_client()).query,
        TableName=tables.USAGE_AGG_SHARDED.physical_name,
        IndexName=index.name,
        KeyConditionExpression="#day = :day",
        ExpressionAttributeNames={"#day": index.partition_key},
        ExpressionAttributeValues={":day": active_day},
    )
    for page in pages:
        yield [{"shard_key": item["shard_key"], "date_key": item["date_key"]} for item in page]


def active_label_days(day: str) -> list[tuple[str, str]]:
    """The (usage_key, date_key) label-days listed on org day ``day`` (``yyyymmdd``), from
    the sparse index: every page of each of its partition keys, the keys concurrently."""
    every_page = query_many(
        lambda client, active_day: [key for page in active_label_day_pages(active_day, client) for key in page],
        keys.active_day_keys(day),
    )
    return [(entry["shard_key"], entry["date_key"]) for found in every_page for entry in found]


ESTIMATED_PAGE = 100  # estimated records a re-pricing run reads (and holds) at once


def estimated_records(model_id: str) -> Iterator[dict]:
    """The records of ``model_id`` counted at the estimate and not re-priced yet, read
    ``ESTIMATED_PAGE`` at a time: the next page is read only once the caller has gone
    through this one, so memory is bounded by a page whatever the backlog (read whole, a
    backlog of ~250k records ran a 512 MB fetcher out of memory before it re-priced any)."""
    for page in query_pages(
        table(tables.USAGE_AGG_SHARDED).query,
        KeyConditionExpression=Key("shard_key").eq(keys.estimated_key(model_id)),
        Limit=ESTIMATED_PAGE,
    ):
        yield from page


def reprice_once(
    pending: dict, delta_usd_micros: int, source: str, now_epoch: int, marker_kept_until: int, attempt: int
) -> bool:
    """Correct one estimated record by ``delta_usd_micros``, exactly once: one
    TransactWriteItems of a Delete of its ``estimated_records`` item, conditional on it
    still being there (the per-record marker: a re-run or an overlapping run that read it
    too cancels here), the record's dedup marker set to the corrected cost, conditional on
    the record not being voided (a later void takes back what is counted, and a duplicate
    is answered with it; from then on the marker is kept as any is, ``marker_kept_until``);
    the fold takes the correction from the marker's images. A voided record is not
    corrected: the void took back what it counted, and its estimated item is dropped.
    True when this call corrected it, False when it was corrected or voided before (or is
    left); ``Conflict`` to retry."""
    name = tables.USAGE_AGG_SHARDED.physical_name
    estimated = {"shard_key": pending["shard_key"], "date_key": pending["date_key"]}
    marker = pending["marker_key"]
    marker_update = {
        "Update": {
            "TableName": name,
            "Key": marker,
            "UpdateExpression": (
                "SET cost_usd_micros = :counted, price_source = :source, repriced_at_epoch = :now, "
                f"{tables.TTL_ATTRIBUTE} = :kept_until"
            ),
            "ConditionExpression": "attribute_exists(shard_key) AND attribute_not_exists(voided_at_epoch)",
            "ExpressionAttributeValues": {
                ":counted": int(pending["cost_usd_micros"]) + delta_usd_micros,
                ":source": source,
                ":now": now_epoch,
                ":kept_until": marker_kept_until,
            },
        }
    }
    items = [
        {"Delete": {"TableName": name, "Key": estimated, "ConditionExpression": "attribute_exists(shard_key)"}},
        marker_update,
    ]
    reasons = transact(items, ClientRequestToken=request_token(items, attempt))
    if reasons is None:
        return True
    if reasons[0].get("Code") == "ConditionalCheckFailed":
        return False
    if reasons[1].get("Code") != "ConditionalCheckFailed":
        raise Conflict(reasons)
    try:  # voided, or its marker is gone: nothing to correct
        table(tables.USAGE_AGG_SHARDED).delete_item(Key=estimated)
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionConflictException":
            raise
    return False  # (a delete that met a concurrent run's transaction is left to the next run)
