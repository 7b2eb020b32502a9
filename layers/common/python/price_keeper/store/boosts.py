"""Config table: quota boosts.

A boost is two writes in one transaction: its own item (``BOOST#ORG#{id}`` /
``BOOST#APP#{app}#{id}``, TTL at expiry: the record of it) and an entry of the quota scope's
config item's ``quota_boosts`` map (the org's item in ORG scope, the app's in APP scope:
``{boost_id: [label, amount, expires_at_epoch]}``), which every config read brings along at
no extra call. A scope item without the map (made before boosts were kept there) has its
boosts read by one Query of its items, and gets the map with its next boost.
"""

from __future__ import annotations

from . import config_items, keys, tables
from .dynamo import transact

BOOSTS_ATTRIBUTE = "quota_boosts"

Entry = tuple[str, int, int]  # (model_label, amount_usd_micros, expires_at_epoch)


def entries_of(scope_item: dict) -> dict[str, Entry] | None:
    """A scope item's boosts by id; None when the item has no map yet (``of_quota`` reads them)."""
    if BOOSTS_ATTRIBUTE not in scope_item:
        return None
    return {
        boost_id: (str(label), int(amount), int(expires))
        for boost_id, (label, amount, expires) in scope_item[BOOSTS_ATTRIBUTE].items()
    }


def create(item: dict, scope_key: dict, *, migrated: dict[str, Entry] | None, expired: list[str], room: int) -> bool:
    """Put the boost's ``item`` and add its entry to the scope item's map, in one transaction.
    ``migrated`` not None: the scope item has no map yet, and it is SET to those boosts (the
    ones of its items that still count) and the new one. Else the new entry is added and the
    ``expired`` ids removed, while the map holds fewer than ``room`` entries. False when the
    scope item changed meanwhile (another boost made the map or filled it): read it again."""
    entry = [item["model_label"], item["amount_usd_micros"], item[tables.TTL_ATTRIBUTE]]
    if migrated is not None:
        update = {
            "UpdateExpression": "SET #boosts = :boosts",
            "ConditionExpression": f"{config_items.MUST_EXIST} AND attribute_not_exists(#boosts)",
            "ExpressionAttributeNames": {"#boosts": BOOSTS_ATTRIBUTE},
            "ExpressionAttributeValues": {
                ":boosts": {**{boost_id: list(old) for boost_id, old in migrated.items()}, item["boost_id"]: entry}
            },
        }
    else:
        removed = {f"#x{n}": boost_id for n, boost_id in enumerate(expired)}
        update = {
            "UpdateExpression": "SET #boosts.#new = :entry"
            + (" REMOVE " + ", ".join(f"#boosts.{name}" for name in removed) if removed else ""),
            "ConditionExpression": f"{config_items.MUST_EXIST} AND size(#boosts) < :room",
            "ExpressionAttributeNames": {"#boosts": BOOSTS_ATTRIBUTE, "#new": item["boost_id"], **removed},
            "ExpressionAttributeValues": {":entry": entry, ":room": room},
        }
    name = tables.CONFIG.physical_name
    reasons = transact(
        [
            {"Put": {"TableName": name, "Item": item, "ConditionExpression": "attribute_not_exists(resource_key)"}},
            {"Update": {"TableName": name, "Key": scope_key, **update}},
        ]
    )
    return reasons is None


def of_quota(org_id: str, app_id: str | None, quota_scope: str) -> dict[str, Entry]:
    """The boosts of one quota from their items (expired ones included until TTL removes
    them): for a scope item without the map."""
    items = config_items.children(
        keys.org_key(org_id),
        keys.boost_prefix(quota_scope, app_id),
        ["boost_id", "model_label", "amount_usd_micros", tables.TTL_ATTRIBUTE],
    )
    return {
        item["boost_id"]: (item["model_label"], int(item["amount_usd_micros"]), int(item[tables.TTL_ATTRIBUTE]))
        for item in items
    }
