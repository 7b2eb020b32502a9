"""PricingCache: a model's prices per day (and region), and the registry of models outside
config.yaml that the daily fetch prices."""

from __future__ import annotations

from collections.abc import Iterable

from . import keys, tables
from .dynamo import batch_get, table, written


def of_day(model_id: str, price_keys: list[str], attributes: Iterable[str]) -> list[dict]:
    """The stored items among ``price_keys`` of the model, in that order (one BatchGetItem)."""
    found = {
        item["price_key"]: item
        for item in batch_get(
            tables.PRICING_CACHE,
            [{"model_id": model_id, "price_key": key} for key in price_keys],
            attributes=["price_key", *attributes],
        )
    }
    return [found[key] for key in price_keys if key in found]


def add_missing(item: dict, price_attributes: Iterable[str]) -> bool:
    """Add the item's attributes to the stored item, each only where absent; False (no
    write) when it already has every one of ``price_attributes``."""
    attributes = [name for name in item if name not in ("model_id", "price_key")]
    prices = [name for name in attributes if name in set(price_attributes)]
    names = {f"#a{i}": name for i, name in enumerate(attributes)}
    by_name = {name: placeholder for placeholder, name in names.items()}
    return written(
        table(tables.PRICING_CACHE).update_item,
        Key={"model_id": item["model_id"], "price_key": item["price_key"]},
        UpdateExpression="SET " + ", ".join(f"{p} = if_not_exists({p}, :{p[1:]})" for p in names),
        ConditionExpression=" OR ".join(f"attribute_not_exists({by_name[name]})" for name in prices),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":{p[1:]}": item[name] for p, name in names.items()},
    )


def registered_models() -> dict[str, str]:
    """{model id: Price List name} of the models outside config.yaml seen so far."""
    item = table(tables.PRICING_CACHE).get_item(Key=keys.PRICE_LIST_REGISTRY_KEY).get("Item") or {}
    return dict(item.get("models") or {})


def register_model(model_id: str, name: str) -> None:
    """Add a model to the registry (two updates: the map may not exist yet)."""
    pricing_table = table(tables.PRICING_CACHE)
    pricing_table.update_item(
        Key=keys.PRICE_LIST_REGISTRY_KEY,
        UpdateExpression="SET models = if_not_exists(models, :empty)",
        ExpressionAttributeValues={":empty": {}},
    )
    pricing_table.update_item(
        Key=keys.PRICE_LIST_REGISTRY_KEY,
        UpdateExpression="SET models.#id = :name",
        ExpressionAttributeNames={"#id": model_id},
        ExpressionAttributeValues={":name": name},
    )


def ceiling(attributes: Iterable[str]) -> dict:
    """The highest price of each component read so far (``raise_ceiling``); {} when none."""
    found = batch_get(tables.PRICING_CACHE, [keys.PRICE_CEILING_KEY], attributes=list(attributes))
    return found[0] if found else {}


def raise_ceiling(prices: dict[str, int]) -> None:
    """Raise each component's highest price to ``prices`` where that is higher (read, then
    one update; runs only ever raise it, so two runs racing leave at worst a lower one
    that the next run raises)."""
    current = table(tables.PRICING_CACHE).get_item(Key=keys.PRICE_CEILING_KEY).get("Item") or {}
    higher = {name: value for name, value in prices.items() if value > int(current.get(name, -1))}
    if not higher:
        return
    names = {f"#a{i}": name for i, name in enumerate(higher)}
    table(tables.PRICING_CACHE).update_item(
        Key=keys.PRICE_CEILING_KEY,
        UpdateExpression="SET " + ", ".join(f"{p} = :{p[1:]}" for p in names),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":{p[1:]}": higher[name] for p, name in names.items()},
    )
