"""DailyTotal: the per-label and per-scope totals the aggregator writes, its heartbeat,
and the reads of selection, aggregates and reports."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date
from typing import NamedTuple

from . import keys, tables
from .dynamo import Read, batch_get, query_all, query_many, table, transact
from .usage import CORRECTIONS, COUNTERS, SETTLED, VOIDS

# What a fold compares (``progress``) and conditions its write on: ``requests`` grows with
# every record; a void takes one request back and adds one to ``voids``; a re-priced
# record's correction adds to ``repriced`` and changes the cost alone.
PROGRESS = ("requests", VOIDS, CORRECTIONS)

# On a scope total: how many labels are listed in items of their own (``keys.spent_label_key``).
LISTED = "labels_listed"
# On ``keys.CONFIG_LABELS_KEY``: every label a config.yaml of this deployment has had.
LABELS = "labels"
LEDGER = ("committed", "settled")  # a quota's ledger (``store.reservations``)
# On a scope total: set by the scope's first reservation of the day, so the reads that show
# what live holds keep (selection, aggregates) read the ledger items only where there are any.
RESERVING = "reserving"
READ_ATTRIBUTES = (
    *COUNTERS,
    VOIDS,
    SETTLED,
    "updated_at_epoch",
    "last_run_epoch",
    LISTED,
    RESERVING,
    *LEDGER,  # (of the ledger items read beside the totals: ``day_read``'s ``ledgers``)
)


def day_read(usage_keys: Iterable[str], day: str, *, include_heartbeat: bool = False, ledgers: bool = False) -> Read:
    """The read of one org day's totals for ``usage_keys`` (with ``ledgers``, their
    reservation ledgers too; and the heartbeat), for ``dynamo.batch_get_many`` beside other
    tables' reads."""
    usage_keys = list(usage_keys)
    wanted = [{"usage_key": usage_key, "date_key": keys.day_key(day)} for usage_key in usage_keys]
    if ledgers:
        wanted += [{"usage_key": usage_key, "date_key": keys.ledger_day_key(day)} for usage_key in usage_keys]
    if include_heartbeat:
        wanted.append(keys.HEARTBEAT_KEY)
    return Read(tables.DAILY_TOTAL, wanted, READ_ATTRIBUTES)


def ledger_read(usage_keys: Iterable[str], day: str) -> Read:
    """The read of the reservation ledgers of ``usage_keys`` on one org day."""
    return Read(
        tables.DAILY_TOTAL,
        [{"usage_key": usage_key, "date_key": keys.ledger_day_key(day)} for usage_key in usage_keys],
        LEDGER,
    )


def fold_read(total_keys: Iterable[dict]) -> Read:
    """The read of the totals a fold moves (label and scope totals) or evaluates alerts on:
    their counters, the newest record folded (``source_updated_at_epoch``) and a label
    total's hour marks (the fold writes them back with this hour's); for
    ``dynamo.batch_get_many`` beside the sticky labels."""
    return Read(
        tables.DAILY_TOTAL,
        list(total_keys),
        [*COUNTERS, *PROGRESS[1:], SETTLED, "source_updated_at_epoch", keys.HOUR_MARKS],
    )


def _folded(item: dict) -> bool:
    """Whether some fold has written this total: it counts a record or a void."""
    return int(item.get("requests", 0)) + int(item.get(VOIDS, 0)) > 0


def lists_apart_beyond(scope_total: dict, label_totals: dict[str, dict], config_labels: Collection[str]) -> bool:
    """Whether a scope-day's spent-label items name a label besides those of
    ``label_totals`` (label -> its total of that day, as a reader holds them). Each folded
    label but a config label (``config_labels``: every label config.yaml has or had, kept
    apart from the scope total) is listed once, in an item, in the transaction that first
    folds it: items counted no more than the held totals with a fold (``_folded``)
    of other labels mean the items name none other."""
    folded_apart = sum(1 for label, item in label_totals.items() if label not in config_labels and _folded(item))
    return int(scope_total.get(LISTED, 0)) > folded_apart


def progress_fields(item: dict) -> tuple[int, ...]:
    """A stored total's ``PROGRESS`` fields (what a fold's write is conditional on)."""
    return tuple(int(item.get(name, 0)) for name in PROGRESS)


class LabelFold(NamedTuple):
    """One label total's move: the sums to SET and the ``progress_fields`` the fold read
    (None: no total yet). The write only lands if the stored total is still the one read."""

    usage_key: str
    date_key: str
    values: dict
    read_progress: tuple[int, ...] | None


def fold_scope_actions(
    scope: str,
    date_key: str,
    moves: list[LabelFold],
    delta: dict,
    scope_values: dict,
    item_labels: list[str],
) -> list[dict]:
    """The actions of one scope-day's fold, all or nothing: SET each label total of
    ``moves`` (each conditional on its stored ``progress`` being what the fold read), ADD
    ``delta`` (the moves' differences) to the scope total and SET ``scope_values`` on it,
    and list the labels whose label-days are folded for the first time: a
    ``keys.spent_label_key`` item put for each of ``item_labels`` (counted in ``LISTED``).
    So the scope total stays the sum of its label totals and a move is added once however
    runs overlap."""
    name = tables.DAILY_TOTAL.physical_name
    actions = [label_total_action(move) for move in moves]
    ttl = tables.TTL_ATTRIBUTE
    if item_labels:
        delta = {**delta, LISTED: len(item_labels)}
    update = "ADD " + ", ".join(f"#{counter} :{counter}" for counter in delta)
    update += " SET " + ", ".join(f"#{field} = :{field}" for field in scope_values if field != ttl)
    update += f", #{ttl} = if_not_exists(#{ttl}, :{ttl})"
    bound = {
        **{f":{counter}": value for counter, value in delta.items()},
        **{f":{field}": value for field, value in scope_values.items()},
    }
    actions.append(
        {
            "Update": {
                "TableName": name,
                "Key": {"usage_key": keys.scope_total_key(scope), "date_key": date_key},
                "UpdateExpression": update,
                "ExpressionAttributeNames": {f"#{n}": n for n in [*delta, *scope_values]},
                "ExpressionAttributeValues": bound,
            }
        }
    )
    return actions + [
        {"Put": {"TableName": name, "Item": {**keys.spent_label_key(scope, date_key, label), ttl: scope_values[ttl]}}}
        for label in item_labels
    ]


def live_costs(usage_keys: Iterable[str], day: str) -> dict[str, int]:
    """The live items' cost of ``usage_keys`` on ``day`` (every part of each), by usage key
    (absent: 0), in one BatchGetItem, strongly consistent: what tight mode adds to the
    totals on a ledger day."""
    found = batch_get(
        tables.DAILY_TOTAL,
        [
            {"usage_key": usage_key, "date_key": keys.live_day_key(day, part)}
            for usage_key in dict.fromkeys(usage_keys)
            for part in range(keys.LIVE_PARTS)
        ],
        attributes=["usage_key", "cost_usd_micros"],
        consistent=True,
    )
    costs: dict[str, int] = {}
    for item in found:
        costs[item["usage_key"]] = costs.get(item["usage_key"], 0) + int(item.get("cost_usd_micros", 0))
    return costs


SEQUENCE_DIGITS = 40  # a stream record's sequence number has at most 40 digits


def sequence_key(sequence_number: str) -> str:
    """A stream sequence number as a string that sorts as the number does (zero-padded)."""
    return sequence_number.rjust(SEQUENCE_DIGITS, "0")


def folded_to(shard_id: str) -> str | None:
    """How far the ledger folded stream shard ``shard_id``: the ``sequence_key`` of its last
    record folded (strongly consistent), or None before its first fold."""
    item = table(tables.DAILY_TOTAL).get_item(Key=keys.ledger_shard_key(shard_id), ConsistentRead=True).get("Item")
    return item["folded_to"] if item else None


class Written(NamedTuple):
    done: bool  # the actions and the shard's progress landed
    folded_to: str | None  # else, the shard's progress as stored (moved on: another run folded)
    overtaken: bool = False  # else, a total had moved since it was read (another shard's fold wrote it)


def write_folded(actions: list[dict], shard_id: str, read: str | None, to: str, expires_at: int) -> Written:
    """``actions`` and stream shard ``shard_id``'s progress moved from ``read`` to ``to``,
    in one TransactWriteItems, only if the progress is still ``read`` (``domain.ledger``):
    when it is not, the progress found; when a condition of ``actions`` failed (``overtaken``)
    or the transaction conflicted, the progress unchanged (read again and write again)."""
    values = {":to": to, ":expires": expires_at} | ({} if read is None else {":read": read})
    progress = {
        "Update": {
            "TableName": tables.DAILY_TOTAL.physical_name,
            "Key": keys.ledger_shard_key(shard_id),
            "UpdateExpression": "SET folded_to = :to, #ttl = :expires",
            "ConditionExpression": "attribute_not_exists(folded_to)" if read is None else "folded_to = :read",
            "ExpressionAttributeNames": {"#ttl": tables.TTL_ATTRIBUTE},
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }
    reasons = transact([*actions, progress])
    if reasons is None:
        return Written(True, to)
    mine = reasons[-1]
    moved = mine.get("Code") == "ConditionalCheckFailed"
    overtaken = any(reason.get("Code") == "ConditionalCheckFailed" for reason in reasons[:-1])
    return Written(False, mine.get("Item", {}).get("folded_to") if moved else read, overtaken)


def label_total_action(move: LabelFold) -> dict:
    """A label total's move as a TransactWriteItems action: SET to ``move.values``, only if
    the stored total is still the one read."""
    return {"Update": _label_update(tables.DAILY_TOTAL.physical_name, move)}


def _label_update(table_name: str, move: LabelFold) -> dict:
    bound = {f":{field}": value for field, value in move.values.items()}
    if move.read_progress is None:
        condition = "attribute_not_exists(#requests)"
    else:
        clauses = []
        for field, value in zip(PROGRESS, move.read_progress, strict=True):
            bound[f":read_{field}"] = value
            clause = f"#{field} = :read_{field}"
            clauses.append(f"(attribute_not_exists(#{field}) OR {clause})" if value == 0 else clause)
        condition = " AND ".join(clauses)
    return {
        "TableName": table_name,
        "Key": {"usage_key": move.usage_key, "date_key": move.date_key},
        "UpdateExpression": "SET " + ", ".join(f"#{field} = :{field}" for field in move.values),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {
            f"#{field}": field for field in {*move.values, "requests", *(PROGRESS if move.read_progress else ())}
        },
        "ExpressionAttributeValues": bound,
    }


def config_labels_ever() -> set[str]:
    """Every label the aggregator has folded with a config.yaml that had it (the item's
    ``labels``; none before it was first written)."""
    found = batch_get(tables.DAILY_TOTAL, [keys.CONFIG_LABELS_KEY])  # what readers of totals are granted
    return set(found[0].get(LABELS, ())) if found else set()


def record_config_labels(labels: Iterable[str]) -> None:
    """Add ``labels`` to ``config_labels_ever`` (a string set: it only grows)."""
    table(tables.DAILY_TOTAL).update_item(
        Key=keys.CONFIG_LABELS_KEY,
        UpdateExpression="ADD #labels :labels",
        ExpressionAttributeNames={"#labels": LABELS},
        ExpressionAttributeValues={":labels": set(labels)},
    )


def put_heartbeat(now_epoch: int, lag_seconds: int) -> None:
    table(tables.DAILY_TOTAL).put_item(
        Item={
            **keys.HEARTBEAT_KEY,
            "last_run_epoch": now_epoch,
            "lag_seconds": lag_seconds,
            "updated_at_epoch": now_epoch,
        }
    )


def claim_grace(left: dict[str, int], day: str, cost: int, expires_at: int) -> bool:
    """Take ``cost`` from what each usage key's closed ``day`` has left for grace bookings,
    all or none (one TransactWriteItems): what is left is ``left[usage_key]`` as the first
    claim read it, then goes down by each claim; False when it would go below 0 (or a
    conflicting claim was in flight)."""
    actions = [
        {
            "Update": {
                "TableName": tables.DAILY_TOTAL.physical_name,
                "Key": keys.grace_key(usage_key, day),
                "UpdateExpression": "SET remaining = if_not_exists(remaining, :left) - :cost, #ttl = :expires",
                # a first claim past what the day had left finds no item and must not make one
                "ConditionExpression": (
                    "attribute_not_exists(remaining) OR remaining >= :cost" if room >= cost else "remaining >= :cost"
                ),
                "ExpressionAttributeNames": {"#ttl": tables.TTL_ATTRIBUTE},
                "ExpressionAttributeValues": {":left": room, ":cost": cost, ":expires": expires_at},
            }
        }
        for usage_key, room in left.items()
    ]
    return transact(actions) is None


def read_days(wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """The totals of (usage_key, day) pairs, by pair (absent: no spend yet), with when each
    was written, in one BatchGetItem: the labels and the scope total a usage reply shows."""
    found = batch_get(
        tables.DAILY_TOTAL,
        [{"usage_key": usage_key, "date_key": keys.day_key(day)} for usage_key, day in dict.fromkeys(wanted)],
        attributes=["cost_usd_micros", "requests", "updated_at_epoch"],
    )
    return {(item["usage_key"], keys.day_of_key(item["date_key"])): item for item in found}


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


# Labels a scope lists in one aggregates answer or report, beside its ordering (the spend of
# any further label is in the scope's total all the same).
MAX_LISTED_LABELS = 400


def spent_labels(scopes: list[str], first: date, last: date) -> list[set[str]]:
    """The labels each of ``scopes`` spent on from ``first`` to ``last`` inclusive, from its
    ``keys.spent_label_key`` items: a paginated Query a scope, concurrently, stopping at
    ``MAX_LISTED_LABELS`` labels."""
    return query_many(lambda client, scope: _spent_labels(client, scope, first, last), scopes)


def _spent_labels(client, scope: str, first: date, last: date) -> set[str]:
    query = {
        "TableName": tables.DAILY_TOTAL.physical_name,
        "KeyConditionExpression": "usage_key = :k AND date_key BETWEEN :first AND :last",
        "ExpressionAttributeValues": {
            ":k": keys.spent_labels_key(scope),
            ":first": keys.day_key(first.strftime("%Y%m%d")) + "#",
            ":last": keys.day_key(last.strftime("%Y%m%d")) + "$",  # after every "DAY#{last}#{label}"
        },
        "ProjectionExpression": "date_key",
    }
    labels: set[str] = set()
    while len(labels) < MAX_LISTED_LABELS:
        page = client.query(**query)
        labels.update(keys.label_of_spent_key(item["date_key"]) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            break
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return set(sorted(labels)[:MAX_LISTED_LABELS])
