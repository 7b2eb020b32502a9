"""StickyState, sticky choice: the labels a scope fell back past for the rest of its org day.

One item per scope and day holding ``passed_labels``, a string set that only grows (ADD):
concurrent writers never lose each other's labels, and the apps of an ORG scope, whatever
their orderings, share which labels were spent rather than a position in one of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import keys, tables
from .dynamo import Read, table

ATTRIBUTES = ("passed_labels",)


def day_read(scope: str, day: str) -> Read:
    """The read of the scope's state, for ``dynamo.batch_get_many`` beside the totals."""
    return Read(tables.STICKY_STATE, [keys.sticky_key(scope, day)], ATTRIBUTES)


def days_read(scope_days: Iterable[tuple[str, str]]) -> Read:
    """The choices of several (scope, day)s, for ``dynamo.batch_get_many`` (the aggregator's alerts)."""
    return Read(tables.STICKY_STATE, [keys.sticky_key(scope, day) for scope, day in scope_days], ATTRIBUTES)


def read(scope: str, day: str, consistent: bool = False) -> dict | None:
    return (
        table(tables.STICKY_STATE)
        .get_item(
            Key=keys.sticky_key(scope, day), ConsistentRead=consistent, ProjectionExpression=", ".join(ATTRIBUTES)
        )
        .get("Item")
    )


def add_passed(scope: str, day: str, labels: set[str], now_epoch: int, expires_at: int) -> tuple[set[str], set[str]]:
    """ADD ``labels`` to the day's passed labels: (the whole set after, the ones this call
    added). Commutative, so two writers racing both land, whatever order they arrive in."""
    reply = table(tables.STICKY_STATE).update_item(
        Key=keys.sticky_key(scope, day),
        UpdateExpression=f"ADD passed_labels :labels SET updated_at_epoch = :now, {tables.TTL_ATTRIBUTE} = "
        f"if_not_exists({tables.TTL_ATTRIBUTE}, :expires)",
        ExpressionAttributeValues={":labels": set(labels), ":now": now_epoch, ":expires": expires_at},
        ReturnValues="ALL_OLD",
    )
    before = set(reply.get("Attributes", {}).get("passed_labels", ()))
    return before | set(labels), set(labels) - before
