"""Config table: quota boosts.

A boost is two writes in one transaction: its own item (``BOOST#ORG#{id}`` /
``BOOST#APP#{app}#{id}``, TTL at expiry: the record of it) and an entry of the quota scope's
config item's ``quota_boosts`` map (the org's item in ORG scope, the app's in APP scope:
``{boost_id: [label, amount, expires_at_epoch]}``), which every config read brings along at
no extra call. Provisioning gives every org and app item an empty map.
"""

from __future__ import annotations

from . import config_items, tables
from .dynamo import transact

BOOSTS_ATTRIBUTE = "quota_boosts"

Entry = tuple[str, int, int]  # (model_label, amount_usd_micros, expires_at_epoch)


def entries_of(scope_item: dict) -> dict[str, Entry]:
    """A scope item's boosts by id."""
    return {
        boost_id: (str(label), int(amount), int(expires))
        for boost_id, (label, amount, expires) in scope_item.get(BOOSTS_ATTRIBUTE, {}).items()
    }


def create(item: dict, scope_key: dict, *, expired: list[str], room: int) -> bool:
    """Put the boost's ``item`` and add its entry to the scope item's map, in one transaction,
    the ``expired`` ids removed, while the map holds fewer than ``room`` entries. False when
    the scope item changed meanwhile (another boost filled it): read it again."""
    entry = [item["model_label"], item["amount_usd_micros"], item[tables.TTL_ATTRIBUTE]]
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
