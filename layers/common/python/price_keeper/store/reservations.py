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

import secrets
from typing import NamedTuple

from boto3.dynamodb.conditions import Key
from botocore.exceptions import BotoCoreError, ClientError

from ..errors import is_retryable
from ..observability import logger
from . import keys, tables
from .daily_totals import RESERVING
from .dynamo import ConditionFailed, _backoff, batch_get, conditional, table, transact


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


class Netted(NamedTuple):
    """One ledger's part of a write: ADD ``committed`` and ``settled``, under
    ``committed <= room`` when a room is given."""

    key: dict
    committed: int
    settled: int
    expires_at: int
    room: int | None = None


def ledger_update(part: Netted) -> dict:
    """The action that ADDs to a ledger (creating the DailyTotal item if needed, with the
    day's TTL), under its room when it has one."""
    update = {
        "TableName": tables.DAILY_TOTAL.physical_name,
        "Key": part.key,
        "UpdateExpression": f"ADD committed :c, settled :s SET {tables.TTL_ATTRIBUTE} = "
        f"if_not_exists({tables.TTL_ATTRIBUTE}, :expires)",
        "ExpressionAttributeValues": {":c": part.committed, ":s": part.settled, ":expires": part.expires_at},
    }
    if part.room is not None:
        update["ConditionExpression"] = "attribute_not_exists(committed) OR committed <= :room"
        update["ExpressionAttributeValues"][":room"] = part.room
    return {"Update": update}


CONFLICT_ATTEMPTS = 5
MAX_NETTED = 100  # a transaction's actions
UNSURE_ATTEMPTS = 3  # sends of one write, under one ClientRequestToken, whose outcome is unknown


class Unsure(Exception):
    """A ledger write whose outcome stayed unknown (no answer after ``UNSURE_ATTEMPTS``
    sends under one token): it may have been applied; never net its refunds again."""


def hold_put(key: dict, attributes: dict, hold_ttl: int) -> dict:
    """The hold item (``attributes`` with ``amount_usd_micros``, kept until ``hold_ttl``)."""
    return {**key, **attributes, tables.TTL_ATTRIBUTE: hold_ttl}


def put_hold(item: dict) -> None:
    """A hold granted from a container's slice: one conditional PutItem, no ledger. An SDK
    retry of a Put that was applied finds its own item: granted all the same."""
    try:
        conditional(
            table(tables.STICKY_STATE).put_item,
            Item=item,
            ConditionExpression="attribute_not_exists(scope_key)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ConditionFailed as failed:
        if (failed.item or {}).get("reservation_id") != item["reservation_id"]:
            raise


def net(ledgers: list[Netted], hold: dict | None = None) -> None:
    """One TransactWriteItems: Put ``hold`` (when given) and ADD each ledger's deltas, each
    under its room: a hold, a lease of a slice or a flush of refunds, netted together, so
    the check and the write are one atomic step. Idempotent against retries: sent under a
    ClientRequestToken, and a send without an answer is sent again under the same token
    (DynamoDB applies it at most once); ``Unsure`` when none answered. ``Refused`` when a
    ledger had no room; ``Conflict`` after ``CONFLICT_ATTEMPTS`` lost races (each attempt a
    new token: a cancelled transaction applied nothing)."""
    actions = []
    if hold is not None:
        actions.append(
            {
                "Put": {
                    "TableName": tables.STICKY_STATE.physical_name,
                    "Item": hold,
                    "ConditionExpression": "attribute_not_exists(scope_key)",
                }
            }
        )
    actions += [ledger_update(part) for part in ledgers]
    for attempt in range(CONFLICT_ATTEMPTS):
        reasons = _send_once(actions, secrets.token_hex(16))
        if reasons is None:
            return
        if any(reason.get("Code") == "ConditionalCheckFailed" for reason in reasons):
            raise Refused()
        _backoff(attempt)
    raise Conflict()


def _send_once(actions: list[dict], token: str) -> list[dict] | None:
    """``transact`` under ``token``, sent again under it while no answer says what became of
    it (a lost answer, a timeout, a throttle, a transaction still in progress)."""
    for attempt in range(UNSURE_ATTEMPTS):
        try:
            return transact(actions, ClientRequestToken=token)
        except (ClientError, BotoCoreError) as error:
            if not is_retryable(error):
                raise  # a definite answer: nothing was applied
            unsure = error
        logger.warning("ledger write unanswered; sent again under its token", extra={"attempt": attempt})
        _backoff(attempt)
    raise Unsure() from unsure


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
