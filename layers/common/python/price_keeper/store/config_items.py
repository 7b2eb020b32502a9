"""Config table: org and app items (settings and credentials)."""

from __future__ import annotations

from collections.abc import Iterable

from boto3.dynamodb.conditions import Key

from ..errors import service_unavailable
from . import keys, tables
from .dynamo import (
    ConditionFailed,
    Read,
    batch_get,
    batch_get_many,
    conditional,
    projection,
    query_all,
    table,
    transact,
    written,
)

MUST_EXIST = "attribute_exists(org_key)"


def client_key(org_id: str, app_id: str | None) -> dict:
    """Key of the org's item (``app_id`` None) or of one of its apps."""
    resource = keys.app_resource(app_id) if app_id else keys.ROOT_RESOURCE
    return {"org_key": keys.org_key(org_id), "resource_key": resource}


def client_item(org_id: str, app_id: str | None) -> dict | None:
    """The org's or app's item, strongly consistent (credentials must be current)."""
    return table(tables.CONFIG).get_item(Key=client_key(org_id, app_id), ConsistentRead=True).get("Item")


def org_and_app(org_id: str, app_id: str | None) -> tuple[dict | None, dict | None]:
    """Org item and (if asked) app item in one consistent BatchGetItem (a throttled,
    incomplete read is retried and then a 503, never a "not registered")."""
    wanted = [client_key(org_id, None)] + ([client_key(org_id, app_id)] if app_id else [])
    items = {item["resource_key"]: item for item in batch_get(tables.CONFIG, wanted, consistent=True)}
    return items.get(keys.ROOT_RESOURCE), (items.get(keys.app_resource(app_id)) if app_id else None)


def clients(
    org_apps: Iterable[tuple[str, str | None]], *, consistent: bool = True
) -> dict[tuple[str, str | None], dict]:
    """The org and app items of many (org, app or None) pairs in BatchGetItems, by pair."""
    org_apps = list(org_apps)
    (items,) = batch_get_many([clients_read(org_apps, consistent=consistent)])
    return clients_found(org_apps, items)


def clients_read(org_apps: Iterable[tuple[str, str | None]], *, consistent: bool) -> Read:
    """The read ``clients`` makes, for a BatchGetItem that carries other tables' keys too."""
    return Read(tables.CONFIG, [client_key(*pair) for pair in org_apps], None, consistent)


def clients_found(
    org_apps: Iterable[tuple[str, str | None]], items: Iterable[dict]
) -> dict[tuple[str, str | None], dict]:
    """The items of ``clients_read(org_apps)`` by pair."""
    found = {(item["org_key"], item["resource_key"]): item for item in items}
    wanted = {pair: client_key(*pair) for pair in org_apps}
    return {
        pair: found[(key["org_key"], key["resource_key"])]
        for pair, key in wanted.items()
        if (key["org_key"], key["resource_key"]) in found
    }


def children(org_key: str, prefix: str, attributes: Iterable[str] = ()) -> list[dict]:
    """The items of ``org_key`` whose ``resource_key`` begins with ``prefix`` (apps, profiles,
    boosts): one paginated Query, only ``resource_key`` and the named attributes."""
    return query_all(
        table(tables.CONFIG).query,
        KeyConditionExpression=Key("org_key").eq(org_key) & Key("resource_key").begins_with(prefix),
        **projection(["resource_key", *attributes]),
    )


def app_items(org_id: str, attributes: Iterable[str] = ()) -> list[dict]:
    """The org's app items (one paginated Query, ``begins_with APP#``), only ``resource_key``
    and the named attributes, each with its ``app_id``."""
    return [
        {**item, "app_id": keys.app_id_of_resource(item["resource_key"])}
        for item in children(keys.org_key(org_id), keys.app_resource(""), attributes)
    ]


def update_existing(key: dict, values: dict, remove: Iterable[str] = (), must_match: dict | None = None) -> dict | None:
    """SET ``values`` and REMOVE ``remove`` on an existing item; the item as stored after.

    None when there is no item. ``ConditionFailed`` (with the stored item) when an attribute
    of ``must_match`` differs from its stored value: nothing is written.
    """
    must_match = must_match or {}
    remove = list(remove)
    names = {f"#s{i}": name for i, name in enumerate(values)}
    names.update({f"#r{i}": name for i, name in enumerate(remove)})
    names.update({f"#m{i}": name for i, name in enumerate(must_match)})
    attribute_values = {f":s{i}": value for i, value in enumerate(values.values())}
    attribute_values.update({f":m{i}": value for i, value in enumerate(must_match.values())})
    expression = "SET " + ", ".join(f"#s{i} = :s{i}" for i in range(len(values)))
    if remove:
        expression += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(remove)))
    condition = " AND ".join([MUST_EXIST, *(f"#m{i} = :m{i}" for i in range(len(must_match)))])
    try:
        return conditional(
            table(tables.CONFIG).update_item,
            Key=key,
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=attribute_values,
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )["Attributes"]
    except ConditionFailed as failed:
        if failed.item is None:
            return None
        raise


def create(item: dict) -> bool:
    """Put a new org or app item; False when one already exists (another request made it)."""
    return written(table(tables.CONFIG).put_item, Item=item, ConditionExpression="attribute_not_exists(org_key)")


def rotation(org_id: str, app_id: str | None, stored_secret: dict, now: int, old_expires: int | None) -> dict:
    """The transaction action of a secret rotation: ``stored_secret`` (hash and fingerprint
    attributes) becomes current, and the current one stays as the previous until
    ``old_expires`` (None: dropped at once). Its condition refuses a new secret whose
    fingerprint equals the current one's."""
    values = {
        ":hash": stored_secret["client_secret_hash"],
        ":fp": stored_secret["client_secret_fingerprint"],
        ":now": now,
    }
    assignments = [
        "client_secret_hash = :hash",
        "client_secret_fingerprint = :fp",
        "client_secret_created_at_epoch = :now",
        "updated_at_epoch = :now",
    ]
    if old_expires is not None:
        # Operands read the item as it was, so the previous hash is the one being replaced.
        # An item from before fingerprints has none: its old secret ends with the rotation.
        assignments += [
            "previous_client_secret_hash = client_secret_hash",
            "previous_client_secret_fingerprint = if_not_exists(client_secret_fingerprint, :none)",
            "client_secret_rotation_grace_expires_at_epoch = :until",
        ]
        values.update({":until": old_expires, ":none": ""})
        expression = "SET " + ", ".join(assignments)
    else:
        expression = (
            "SET " + ", ".join(assignments) + " REMOVE previous_client_secret_hash, "
            "previous_client_secret_fingerprint, client_secret_rotation_grace_expires_at_epoch"
        )
    return {
        "Update": {
            "TableName": tables.CONFIG.physical_name,
            "Key": client_key(org_id, app_id),
            "UpdateExpression": expression,
            "ExpressionAttributeValues": values,
            "ConditionExpression": f"{MUST_EXIST} AND (attribute_not_exists(client_secret_fingerprint) "
            "OR client_secret_fingerprint <> :fp)",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def registered(org_id: str, app_id: str | None) -> dict:
    """The transaction action that only checks the org or app exists."""
    return {
        "ConditionCheck": {
            "TableName": tables.CONFIG.physical_name,
            "Key": client_key(org_id, app_id),
            "ConditionExpression": MUST_EXIST,
        }
    }


def write_with_cutoff(client_action: dict, cutoff: dict) -> bool | None:
    """A conditional action on a client's Config item and its token cutoff
    (``revocations.cutoff_update``) in one transaction, both or neither.

    True when written, False when the action's condition failed on an existing item, None
    when the org or app does not exist; a throttled or conflicting transaction is a 503.
    """
    reasons = transact([client_action, cutoff])
    if reasons is None:
        return True
    if reasons[0].get("Code") == "ConditionalCheckFailed":
        return False if "Item" in reasons[0] else None
    raise service_unavailable()


def probe() -> None:
    """One eventually consistent GetItem of an item that never exists: raises when the
    store does not answer."""
    table(tables.CONFIG).get_item(Key=keys.HEALTH_PROBE)
