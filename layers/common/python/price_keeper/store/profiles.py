"""Config table: an app's registered inference profiles (``PROFILE#{label}`` items)."""

from __future__ import annotations

from collections.abc import Iterable

from . import config_items, keys, tables
from .dynamo import ConditionFailed, batch_get, conditional, table


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


def find_many(org_id: str, app_id: str, labels: Iterable[str]) -> dict[str, str]:
    """The ARN of each of ``labels`` the app registered (absent: not registered), by label:
    one BatchGetItem per 100 labels."""
    items = batch_get(
        tables.CONFIG,
        [profile_key(org_id, app_id, label) for label in labels],
        attributes=["resource_key", "inference_profile_arn"],
    )
    return {keys.profile_label_of_resource(item["resource_key"]): item["inference_profile_arn"] for item in items}


def labels(org_id: str, app_id: str) -> list[str]:
    """Labels registered for the app (keys only)."""
    found = config_items.children(keys.profile_org_key(org_id, app_id), keys.profile_resource(""))
    return [keys.profile_label_of_resource(item["resource_key"]) for item in found]
