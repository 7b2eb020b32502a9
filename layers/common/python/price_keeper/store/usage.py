"""UsageAggSharded: the exactly-once usage write and the shard reads.

A record is one TransactWriteItems of two actions: Put the dedup marker
(``ORG#{org}#APP#{app}#REQ#{id}`` / ``DEDUP``, ``attribute_not_exists``) and ADD the
record's counters to its shard (``{scope}#LABEL#{label}#SH#{n}`` / ``DAY#{day}``). Both
land or neither does; a duplicate cancels on the marker, whose ``ALL_OLD`` item tells
the retry what the first acceptance counted.

A batch's records share transactions (``group_items``): every record's marker, and one ADD
per shard of the sums of the records counted in it. The same all-or-nothing argument, for
a write unit pair per record (its marker) instead of two.

A record of a ledger day (``LEDGER``) is its marker alone, with no shard ADD: one
conditional PutItem when nothing is written beside it (``write_group``), and its void or
re-pricing the marker's update alone (``domain.ledger`` folds the changes).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Iterator

from boto3.dynamodb.conditions import Key
from botocore.exceptions import ClientError

from . import keys, tables
from .dynamo import (
    ConditionFailed,
    Read,
    batch_get,
    conditional,
    ddb_client,
    query_many,
    query_pages,
    table,
    transact,
)

# Re-pricings applied to a shard (and summed into its totals): a correction changes the
# cost without a new request, and this counter growing is what makes the fold write it.
CORRECTIONS = "repriced"
# The counters a shard and a DailyTotal hold (they only ever grow, but for a re-priced record's
# correction, see ``reprice_once``, and a voided record's subtraction).
COUNTERS = (
    "cost_usd_micros",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "requests",
)


# The cost of records that settled a reservation (``domain.reservations``), a shard's and a
# total's: ADDed with the record, folded with it, so a reader knows how much of the settled
# spend its totals already hold (``aggregation.Totals.unreserved``).
SETTLED = "settled_usd_micros"

# Records voided (``domain.voids``), a shard's and a total's: it only grows, so with
# ``requests`` it gives the aggregator a generation that grows on every write, a void too
# (``daily_totals.write_if_grown``).
VOIDS = "voids"


MAX_TRANSACTION_ACTIONS = 100  # TransactWriteItems' limit

# On a dedup marker (and a record's estimated item): the record is counted by the ledger,
# its marker alone, which the aggregator folds from the stream's images (``domain.ledger``).
LEDGER = "ledger"
# On a ledger record's marker written by a lone PutItem: the call that wrote it (``write_group``).
PUT_BY = "put_by"
# On a ledger record's marker written while its label-day was tight: its cost was also
# ADDed to the label-day's live item, which the fold takes it back from (``domain.ledger``).
LIVE = "live"


class Conflict(Exception):
    """The write of ``items`` was cancelled for a reason other than a counted request id:
    retry it. ``contended``: it lost a race with a concurrent transaction on one of its
    shards (a hot shard, which ``domain.hot_labels`` spreads); else it was throttled, it
    raced on another item (the record's own marker, written by a copy of it in flight on
    another container, or a settlement's hold or ledger: more shards would not help), or a
    condition of an action appended to the record (a reservation's settlement) failed."""

    def __init__(self, reasons: list[dict], items: list[dict]):
        codes = {reason.get("Code") for reason in reasons}
        super().__init__(", ".join(sorted(code for code in codes if code and code != "None")))
        self.contended = any(
            reason.get("Code") == "TransactionConflict" and _is_shard_update(action)
            for reason, action in zip(reasons, items, strict=False)
        )


def _is_shard_update(action: dict) -> bool:
    update = action.get("Update")
    return (
        update is not None
        and update["TableName"] == tables.USAGE_AGG_SHARDED.physical_name
        and update["Key"]["date_key"] != keys.DEDUP_SORT_KEY
    )


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
                ":day": keys.active_day_key(day, keys.split_scope(scope)[0]),
                ":expires": expires_at,
            },
        }
    }


def ledger_day_listed(scope: str, label: str, day: str, now_epoch: int, expires_at: int) -> dict:
    """A ledger label-day's entry in the ``active-by-day`` index, as a TransactWriteItems
    action of its first records (before its total exists) and its first fold: its first
    shard's item, with no counters (it counts nothing, so the audit's fold of it moves
    nothing), so ``org_has_spend`` sees the day's spend."""
    return {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": {"shard_key": keys.shard_key(scope, label, 0), "date_key": keys.day_key(day)},
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


def live_update(usage_key: str, day: str, part: int, cost_usd_micros: int, expires_at: int) -> dict:
    """ADD ``cost_usd_micros`` (negative: folded) to one of a ledger label-day's live items
    (``keys.live_part``), as a TransactWriteItems action."""
    return {
        "Update": {
            "TableName": tables.DAILY_TOTAL.physical_name,
            "Key": {"usage_key": usage_key, "date_key": keys.live_day_key(day, part)},
            "UpdateExpression": "ADD cost_usd_micros :c SET "
            + f"{tables.TTL_ATTRIBUTE} = if_not_exists({tables.TTL_ATTRIBUTE}, :e)",
            "ExpressionAttributeValues": {":c": cost_usd_micros, ":e": expires_at},
        }
    }


def group_items(records: list[dict]) -> list[dict]:
    """The actions of records written in one transaction (one, or a batch's). Per record:
    its dedup ``marker`` (what a duplicate is answered with; ``dedup_key``, ``now_epoch``,
    ``marker_expires_at``) and, for one counted at the estimate, its ``estimated`` item
    (``model_id`` and what re-pricing needs, written once with the record since the marker
    is). Per shard (``scopes`` x ``label``, ``shard_id``, ``day``: the quota scope, and in
    ORG scope the app's own counters), ONE ADD of the ``counts`` of the records counted in
    it (``COUNTERS`` but ``requests``, which is one a record; ``SETTLED`` for a record
    settling a reservation). The markers come first, in
    the order of ``records``, so a cancellation reason's index names its record."""
    sums: dict[tuple[str, str, int, str], dict[str, int]] = {}
    for record in records:
        for scope in [] if record.get("ledger") else record["scopes"]:  # (the ledger's marker is its count)
            where = (scope, record["label"], record["shard_id"], record["day"])
            shard = sums.setdefault(where, dict.fromkeys(COUNTERS, 0))
            for counter in COUNTERS:
                shard[counter] += 1 if counter == "requests" else record["counts"][counter]
            if record["counts"].get(SETTLED):  # (only a settling record, which is written alone)
                shard[SETTLED] = shard.get(SETTLED, 0) + record["counts"][SETTLED]
    live: dict[tuple[str, str, int], int] = {}  # one ADD a live item: a transaction touches an item once
    for record in records:
        if record.get("live"):
            where = _live_item(record)
            live[where] = live.get(where, 0) + record["counts"]["cost_usd_micros"]
    now_epoch, expires_at = max(r["now_epoch"] for r in records), max(r["expires_at"] for r in records)
    return [
        *(_marker_put(record) for record in records),
        *(shard_update(*where, counters, now_epoch, expires_at) for where, counters in sums.items()),
        *(_estimated_put(record) for record in records if record.get("estimated")),
        *(live_update(*where, cost, expires_at) for where, cost in live.items()),
        *(ledger_day_listed(*where, now_epoch, expires_at) for where in sorted(_days_listed(records))),
    ]


def _live_item(record: dict) -> tuple[str, str, int]:
    """The live item (usage key, day, part) a tight ledger record ADDs its cost to."""
    return keys.usage_key(record["scopes"][0], record["label"]), record["day"], keys.live_part(record["dedup_key"])


def _days_listed(records: list[dict]) -> set[tuple[str, str, str]]:
    """The (scope, label, day) whose index entries ``records`` put (``ledger_day_listed``)."""
    return {(r["scopes"][0], r["label"], r["day"]) for r in records if r.get("lists_day")}


def group_size(records: list[dict]) -> int:
    """How many actions ``group_items`` makes of ``records`` once the records of each
    label-day share one shard, as ``domain.metering`` places them (a transaction takes 100)."""
    label_days = {(scope, r["label"], r["day"]) for r in records if not r.get("ledger") for scope in r["scopes"]}
    live = {_live_item(r) for r in records if r.get("live")}
    estimated = sum(1 for r in records if r.get("estimated"))
    return len(records) + len(label_days) + len(live) + len(_days_listed(records)) + estimated


def _marker_put(record: dict) -> dict:
    item = {
        "shard_key": record["dedup_key"],
        "date_key": keys.DEDUP_SORT_KEY,
        **record["marker"],
        **({LEDGER: 1} if record.get("ledger") else {}),
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
        "scopes": record["scopes"],
        "model_label": record["label"],
        "shard_id": record["shard_id"],
        "org_day": record["day"],
        "cost_usd_micros": record["counts"]["cost_usd_micros"],
        **({LEDGER: 1} if record.get("ledger") else {}),
        tables.TTL_ATTRIBUTE: record["expires_at"],
    }
    return {"Put": {"TableName": tables.USAGE_AGG_SHARDED.physical_name, "Item": pending}}


# Keys this process's request tokens: two containers writing the same record in the same
# second (a client's retry on another container, on a label-day of one shard) build the same
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
    raise Conflict(reasons, items)


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
    condition fails on a marker already voided or gone, or re-priced since ``marker`` was
    read) and ADD ``counters`` (the record's, negated, and ``voids`` 1) to the shard of
    each scope it was counted in."""
    mark = {
        "Update": {
            "TableName": tables.USAGE_AGG_SHARDED.physical_name,
            "Key": {"shard_key": dedup_key, "date_key": keys.DEDUP_SORT_KEY},
            "UpdateExpression": "SET voided_at_epoch = :now, void_reason = :reason",
            "ConditionExpression": (
                "attribute_exists(shard_key) AND attribute_not_exists(voided_at_epoch) AND cost_usd_micros = :read"
            ),
            "ExpressionAttributeValues": {":now": now_epoch, ":reason": reason, ":read": marker["cost_usd_micros"]},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }
    if marker.get(LEDGER):  # the fold takes it back from the marker's images
        return [mark]
    label, shard_id, day = marker["model_label"], int(marker["shard_id"]), marker["org_day"]
    return [mark, *(shard_update(scope, label, shard_id, day, counters, now_epoch, expires_at) for scope in scopes)]


def org_has_spend(org_id: str, day: str) -> bool:
    """Whether any scope of the org (the org's or an app's) has a shard on ``day``: a Query
    of the ``active-by-day`` index, ``begins_with ORG#{org}#``, at most one key, under the
    org's bucket (and under the bare day key, where shards made before the buckets are)."""
    index = tables.ACTIVE_BY_DAY
    for partition in (keys.active_day_key(day, org_id), keys.day_key(day)):
        found = table(tables.USAGE_AGG_SHARDED).query(
            IndexName=index.name,
            Limit=1,
            KeyConditionExpression=Key(index.partition_key).eq(partition)
            & Key(index.sort_key).begins_with(keys.org_key(org_id) + "#"),
        )
        if found["Items"]:
            return True
    return False


def active_shard_pages(active_day: str, client=None) -> Iterator[list[dict]]:
    """Keys of the shards under one ``active-by-day`` partition key (``keys.active_day_keys``),
    a Query page at a time."""
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


def active_shard_keys(day: str) -> list[dict]:
    """Keys of the shards written for org day ``day`` (``yyyymmdd``), from the sparse GSI:
    every page of each of its partition keys, the keys concurrently."""
    every_page = query_many(
        lambda client, active_day: [key for page in active_shard_pages(active_day, client) for key in page],
        keys.active_day_keys(day),
    )
    return [key for found in every_page for key in found]


def shards_read(shard_keys: Iterable[dict]) -> Read:
    """The read of shards to fold (and of label-days' shard count items), for
    ``dynamo.batch_get_many`` beside the totals."""
    return Read(
        tables.USAGE_AGG_SHARDED,
        list(shard_keys),
        [*COUNTERS, CORRECTIONS, VOIDS, SETTLED, "updated_at_epoch", "shard_count"],
    )


def raise_shard_count(count_key: dict, count: int, expires_at: int) -> int:
    """Raise a label-day's shard count to ``count`` unless it is already as high; the count
    stored after (one conditional UpdateItem; the stored item comes back when it fails)."""
    try:
        conditional(
            table(tables.USAGE_AGG_SHARDED).update_item,
            Key=count_key,
            UpdateExpression=f"SET shard_count = :count, {tables.TTL_ATTRIBUTE} = :expires",
            ConditionExpression="attribute_not_exists(shard_count) OR shard_count < :count",
            ExpressionAttributeValues={":count": count, ":expires": expires_at},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return count
    except ConditionFailed as failed:
        return int((failed.item or {}).get("shard_count", count))


def read_shards(shard_keys: Iterable[dict], attributes: Iterable[str], *, consistent: bool = False) -> list[dict]:
    """The existing shards among ``shard_keys`` (any number; BatchGetItem)."""
    return batch_get(tables.USAGE_AGG_SHARDED, shard_keys, attributes=attributes, consistent=consistent)


def label_spends(scope: str, labels: Iterable[str], day: str, shard_count: int) -> dict[str, int]:
    """``cost_usd_micros`` of each label of ``scope`` on ``day`` summed over its shards; 0 for
    a label with no shard yet: live spend, for model selection in tight mode.

    DailyTotal lags the shards until the aggregator folds them. Near a quota that lag is
    what a burst overspends, so tight mode reads the shards themselves: one BatchGetItem of
    labels x shards (e.g. 3 labels x 8 shards = 24 keys, ~12 read units eventually
    consistent, vs 1.5 for the totals) and their shard count items; the shards of a label
    whose count was raised (``domain.hot_labels``) in a second. ``benchmarks/overshoot.py``
    measures what it buys.
    """
    labels = list(labels)
    date_key = keys.day_key(day)
    wanted = [key for label in labels for key in keys.shard_item_keys(scope, label, date_key, shard_count)]
    counts = [keys.shard_count_key(scope, label, date_key) for label in labels]  # hot labels have more shards
    found = read_shards([*wanted, *counts], ["cost_usd_micros", "shard_count"])
    above = [
        key
        for item in found
        if keys.is_shard_count_key(item["date_key"])
        for key in keys.shard_item_keys(
            scope, keys.split_usage_key(item["shard_key"])[1], date_key, int(item["shard_count"])
        )[shard_count:]
    ]
    spends = dict.fromkeys(labels, 0)
    for item in [*found, *(read_shards(above, ["cost_usd_micros"]) if above else [])]:
        if not keys.is_shard_count_key(item["date_key"]):
            spends[keys.label_of_shard(item["shard_key"])] += int(item.get("cost_usd_micros", 0))
    return spends


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
    """Correct one estimated record's shard by ``delta_usd_micros``, exactly once: one
    TransactWriteItems of a Delete of its ``estimated_records`` item, conditional on it
    still being there (the per-record marker: a re-run or an overlapping run that read it
    too cancels here), the record's dedup marker set to the corrected cost, conditional on
    the record not being voided (a later void takes back what is counted, and a duplicate
    is answered with it; from then on the marker is kept as any is, ``marker_kept_until``),
    and the ADD of the delta (and one ``CORRECTIONS``) to its shard in each scope it was
    counted in. A voided record is not corrected: the void took back what it counted, and
    its estimated item is dropped. So is one whose marker is gone, left at the estimate
    (records counted before markers of estimated records lived as long as their estimated
    items: whether they were voided cannot be known, and the estimate is the higher cost).
    True when this call corrected it, False when it was corrected or voided before (or is
    left); ``Conflict`` to retry."""
    name = tables.USAGE_AGG_SHARDED.physical_name
    estimated = {"shard_key": pending["shard_key"], "date_key": pending["date_key"]}
    marker = {"shard_key": pending["date_key"], "date_key": keys.DEDUP_SORT_KEY}  # (keyed by the record's dedup key)
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
    shard_adds = [
        {
            "Update": {
                "TableName": name,
                "Key": {
                    "shard_key": keys.shard_key(scope, pending["model_label"], int(pending["shard_id"])),
                    "date_key": keys.day_key(pending["org_day"]),
                },
                "UpdateExpression": f"ADD cost_usd_micros :delta, {CORRECTIONS} :one SET updated_at_epoch = :now",
                "ExpressionAttributeValues": {":delta": delta_usd_micros, ":one": 1, ":now": now_epoch},
            }
        }
        for scope in ([] if pending.get(LEDGER) else pending["scopes"])  # (the ledger's: from the marker's images)
    ]
    items = [
        {"Delete": {"TableName": name, "Key": estimated, "ConditionExpression": "attribute_exists(shard_key)"}},
        marker_update,
        *shard_adds,
    ]
    reasons = transact(items, ClientRequestToken=request_token(items, attempt))
    if reasons is None:
        return True
    if reasons[0].get("Code") == "ConditionalCheckFailed":
        return False
    if reasons[1].get("Code") != "ConditionalCheckFailed":
        raise Conflict(reasons, items)
    try:  # voided, or its marker is gone: nothing to correct
        table(tables.USAGE_AGG_SHARDED).delete_item(Key=estimated)
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionConflictException":
            raise
    return False  # (a delete that met a concurrent run's transaction is left to the next run)
