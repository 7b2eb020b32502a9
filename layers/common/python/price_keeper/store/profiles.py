"""Config table: an app's registered inference profiles (``PROFILE#{label}`` items)."""

from __future__ import annotations

from . import config_items, keys, tables
from .dynamo import ConditionFailed, conditional, table


def profile_key(org_id: str, app_id: str, label: str) -> dict:
    return {"org_key": keys.profile_org_key(org_id, app_id), "resource_key": keys.profile_resource(label)}


def create(item: dict) -> None:
    """Put a new profile item; ``ConditionFailed`` with the stored item when the label is taken."""
    conditional(
        table(tables.CONFIG).put_item,
        Item=item,
        ConditionExpression="attribute_not_exists(resource_key)",
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )


def claim(arn: str, org_id: str, now_epoch: int) -> str:
    """Make ``org_id`` the owner of an application inference profile (one conditional put,
    kept while the org is); the org that owns it (another than ``org_id`` when it was
    claimed first)."""
    try:
        conditional(
            table(tables.CONFIG).put_item,
            Item={**keys.application_profile_owner_key(arn), "org_id": org_id, "claimed_at_epoch": now_epoch},
            ConditionExpression="attribute_not_exists(org_key) OR org_id = :org",
            ExpressionAttributeValues={":org": org_id},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ConditionFailed as taken:
        return (taken.item or {}).get("org_id", "")
    return org_id


def find(org_id: str, app_id: str, label: str) -> dict | None:
    return table(tables.CONFIG).get_item(Key=profile_key(org_id, app_id, label)).get("Item")


def labels(org_id: str, app_id: str) -> list[str]:
    """Labels registered for the app (keys only)."""
    found = config_items.children(keys.profile_org_key(org_id, app_id), keys.profile_resource(""))
    return [keys.profile_label_of_resource(item["resource_key"]) for item in found]
