"""StickyState, sticky choice: the model a scope fell back to for the rest of its org day."""

from __future__ import annotations

from collections.abc import Iterable

from . import keys, tables
from .dynamo import Read, table, written

ATTRIBUTES = ("active_model_label", "active_model_index")


def day_read(scope: str, day: str) -> Read:
    """The read of the scope's choice, for ``dynamo.batch_get_many`` beside the totals."""
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


def advance(scope: str, day: str, attributes: dict, expires_at: int) -> bool:
    """Move the day's choice forward to ``attributes["active_model_index"]``; False when
    another writer already moved it as far or further (the seed's conditional write)."""
    item = {**keys.sticky_key(scope, day), **attributes, tables.TTL_ATTRIBUTE: expires_at}
    return written(
        table(tables.STICKY_STATE).put_item,
        Item=item,
        ConditionExpression="attribute_not_exists(active_model_label) OR active_model_index < :new_index",
        ExpressionAttributeValues={":new_index": attributes["active_model_index"]},
    )
