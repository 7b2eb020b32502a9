"""Reservations (hard cap): the holds in StickyState and the quota ledgers in DailyTotal.

A quota's *ledger* is three counters on a DailyTotal item beside the total it caps (the
label's ``{scope}#LABEL#{label}`` and the scope's ``{scope}#TOTAL``, with the sort key
``LEDGER#yyyymmdd`` of the org day): ``committed`` (actual cost of every reserved call
settled so far + the amount of every live hold) and ``settled`` (the settled part alone).
A settling record carries its cost as ``usage.SETTLED`` too, which the fold adds to the
totals, so a reader can tell settled spend the fold has not counted yet from spend it has
(``aggregation.Totals.unreserved``).

The ledger is not on the total's own ``DAY#`` item, which the aggregator writes: every
hold and settlement is a transaction on its ledgers, and DynamoDB refuses a single write
to an item a transaction is writing, so under steady reserved traffic the fold lost every
attempt and the label's total stood still (a red-team run: 15 s, while holds were granted
on it). The scope total's ``DAY#`` item carries ``reserving`` from the scope's first hold
of the day, so the reads that show live holds read the ledgers only where there are any.

A hold is a StickyState item that lives exactly as long as the hold does: settle, release
and expiry each *delete* it under ``attribute_exists`` in one transaction with the ledger
update, so each happens at most once and a second attempt finds nothing to undo.
"""

from __future__ import annotations

from boto3.dynamodb.conditions import Key
from botocore.exceptions import BotoCoreError, ClientError

from ..observability import logger
from . import keys, tables
from .daily_totals import RESERVING
from .dynamo import _backoff, batch_get, table, transact


class Refused(Exception):
    """A ledger's condition failed: its quota cannot hold the reservation."""


class Conflict(Exception):
    """Lost a race with a concurrent transaction on the same items: retry."""


def ledger_key(usage_key: str, day: str) -> dict:
    return {"usage_key": usage_key, "date_key": keys.ledger_day_key(day)}


def mark_reserving(scope_total_key: str, day: str, expires_at: int) -> None:
    """Flag the scope total's ``DAY#`` item (``daily_totals.RESERVING``): once a scope-day.
    A write that meets the aggregator's is left to the scope's next hold (the flag only
    decides whether readers that show the holds read the ledgers)."""
    try:
        table(tables.DAILY_TOTAL).update_item(
            Key={"usage_key": scope_total_key, "date_key": keys.day_key(day)},
            UpdateExpression=f"SET {RESERVING} = :yes, {tables.TTL_ATTRIBUTE} = "
            f"if_not_exists({tables.TTL_ATTRIBUTE}, :expires)",
            ExpressionAttributeValues={":yes": True, ":expires": expires_at},
        )
    except (BotoCoreError, ClientError):  # the hold is stored and counted: never fail it for its flag
        logger.warning("the scope's reserving flag was not written; its next hold writes it", exc_info=True)


def ledger_update(key: dict, committed: int, settled: int, expires_at: int) -> dict:
    """ADD to a ledger (creating the DailyTotal item if needed, with the day's TTL)."""
    return {
        "Update": {
            "TableName": tables.DAILY_TOTAL.physical_name,
            "Key": key,
            "UpdateExpression": f"ADD committed :c, settled :s SET {tables.TTL_ATTRIBUTE} = "
            f"if_not_exists({tables.TTL_ATTRIBUTE}, :expires)",
            "ExpressionAttributeValues": {":c": committed, ":s": settled, ":expires": expires_at},
        }
    }


CONFLICT_ATTEMPTS = 5


def hold(key: dict, attributes: dict, hold_ttl: int, ledgers: list[tuple[dict, int]], expires_at: int) -> None:
    """Put the hold (``attributes`` with ``amount_usd_micros``, kept until ``hold_ttl``) and
    ADD its amount to each ledger whose ``committed`` is at most the given room (quota −
    unreserved spend − amount): one TransactWriteItems, so the check and the hold are one
    atomic step. ``Refused`` when a ledger had no room; ``Conflict`` after
    ``CONFLICT_ATTEMPTS`` lost races (jittered backoff between them)."""
    item = {**key, **attributes, tables.TTL_ATTRIBUTE: hold_ttl}
    amount = item["amount_usd_micros"]
    actions = [
        {
            "Put": {
                "TableName": tables.STICKY_STATE.physical_name,
                "Item": item,
                "ConditionExpression": "attribute_not_exists(scope_key)",
            }
        }
    ]
    for key, room in ledgers:
        update = ledger_update(key, amount, 0, expires_at)
        update["Update"]["ConditionExpression"] = "attribute_not_exists(committed) OR committed <= :room"
        update["Update"]["ExpressionAttributeValues"][":room"] = room
        actions.append(update)
    for attempt in range(CONFLICT_ATTEMPTS):
        reasons = transact(actions)
        if reasons is None:
            return
        if any(reason.get("Code") == "ConditionalCheckFailed" for reason in reasons[1:]):
            raise Refused()
        _backoff(attempt)
    raise Conflict()


def delete_hold(key: dict) -> dict:
    """The action that ends a live hold: Delete it only if it still exists."""
    return {
        "Delete": {
            "TableName": tables.STICKY_STATE.physical_name,
            "Key": key,
            "ConditionExpression": "attribute_exists(scope_key)",
        }
    }


def end(actions: list[dict]) -> bool:
    """Run actions whose first is a ``delete_hold``: True when this call ended the hold,
    False when it was already gone; ``Conflict`` to retry."""
    reasons = transact(actions)
    if reasons is None:
        return True
    if reasons[0].get("Code") == "ConditionalCheckFailed":
        return False
    raise Conflict()


def read(key: dict) -> dict | None:
    return table(tables.STICKY_STATE).get_item(Key=key, ConsistentRead=True).get("Item")


def read_many(hold_keys: list[dict]) -> dict[tuple[str, str], dict]:
    """The holds among ``hold_keys`` (repeats allowed) that exist, by (scope_key, date_key):
    one strongly consistent BatchGetItem per 100 distinct keys."""
    distinct = list({(key["scope_key"], key["date_key"]): key for key in hold_keys}.values())
    found = batch_get(tables.STICKY_STATE, distinct, consistent=True) if distinct else []
    return {(item["scope_key"], item["date_key"]): item for item in found}


def expired(scope: str, day: str, now_epoch: int, limit: int) -> list[dict]:
    """Up to ``limit`` live holds of a scope and day whose expiry has passed, the longest
    expired first (their sort key starts with the expiry): one key-range Query of one page."""
    return table(tables.STICKY_STATE).query(
        KeyConditionExpression=Key("scope_key").eq(keys.reservations_partition(scope, day))
        & Key("date_key").lt(keys.reservation_expired_bound(now_epoch)),
        Limit=limit,
    )["Items"]
