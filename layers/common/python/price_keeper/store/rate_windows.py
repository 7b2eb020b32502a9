"""StickyState, rate-limit windows: one request counter per client, limit and window
(``RATE#{client}`` / ``LIMIT#{name}#{window_start}``, TTL past the window's end)."""

from __future__ import annotations

from . import keys, tables
from .dynamo import ConditionFailed, conditional, table


def lease(
    client: str, limit_name: str, window_start: int, size: int, ceiling: int, expires_at: int
) -> tuple[bool, int]:
    """ADD ``size`` to the window's counter unless that would pass ``ceiling`` requests:
    (True, the count after) or, when refused, (False, the count that refused it)."""
    try:
        updated = conditional(
            table(tables.STICKY_STATE).update_item,
            Key=keys.rate_window_key(client, limit_name, window_start),
            UpdateExpression=f"ADD used :n SET {tables.TTL_ATTRIBUTE} = :ttl",
            ConditionExpression="attribute_not_exists(used) OR used <= :ceiling",
            ExpressionAttributeValues={":n": size, ":ceiling": ceiling - size, ":ttl": expires_at},
            ReturnValues="UPDATED_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ConditionFailed as refused:
        return False, int((refused.item or {}).get("used", ceiling))
    return True, int(updated["Attributes"]["used"])


def give_back(client: str, limit_name: str, window_start: int, expires_at: int) -> None:
    """One request back to the window's counter (an unconditional ``ADD -1``)."""
    table(tables.STICKY_STATE).update_item(
        Key=keys.rate_window_key(client, limit_name, window_start),
        UpdateExpression=f"ADD used :minus_one SET {tables.TTL_ATTRIBUTE} = :ttl",
        ExpressionAttributeValues={":minus_one": -1, ":ttl": expires_at},
    )
