"""Config table: quota boosts (``BOOST#ORG#{id}`` / ``BOOST#APP#{app}#{id}`` items, TTL at expiry)."""

from __future__ import annotations

from . import config_items, keys, tables
from .dynamo import table


def create(item: dict) -> None:
    """Put a new boost item (its id is fresh; the condition guards against a reused id)."""
    table(tables.CONFIG).put_item(Item=item, ConditionExpression="attribute_not_exists(resource_key)")


def of_quota(org_id: str, app_id: str | None, quota_scope: str) -> list[dict]:
    """The boosts of one quota (expired ones included until TTL removes them): label,
    amount and expiry epoch."""
    return config_items.children(
        keys.org_key(org_id),
        keys.boost_prefix(quota_scope, app_id),
        ["model_label", "amount_usd_micros", tables.TTL_ATTRIBUTE],
    )
