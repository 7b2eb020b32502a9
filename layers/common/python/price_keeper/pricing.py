"""Prices and cost maths.

Cost is integer micro-USD computed server-side: every token count times its price (micro-USD
per 1M tokens) is summed exactly in integers and divided by 1M **once**, rounding **up**
(a spend guard never under-counts; the error is below one micro-USD per record).

The price of a day for a model comes from PricingCache: ``{yyyy-mm-dd}#{region}`` when the
usage names a region, then ``{yyyy-mm-dd}``, then the label's fallback prices from
``config.yaml``. The daily pricing fetcher fills PricingCache from the AWS Price List API.
"""
from __future__ import annotations

import json
import os
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Iterable, NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from . import tables
from .aws import table
from .cache import TTLCache
from .config import Prices, get_config
from .errors import invalid_config
from .observability import logger
from .storage import batch_get
from .timeutil import org_days_in_play, utc_now

TOKENS_PER_PRICE = 1_000_000  # prices are per 1M tokens
MICROS_PER_USD = 1_000_000

PRICING_API = "PRICING_API"
CONFIG_FALLBACK = "CONFIG_FALLBACK"

PRICE_CACHE_SECONDS = 600
PRICE_TTL_DAYS = 3
PRICE_LIST_ENDPOINT_REGION = "us-east-1"  # the Price List API answers from us-east-1 for every region
SERVICE_CODE = "AmazonBedrock"

PRICE_ATTRIBUTES = {
    "input": "input_price_usd_micros_per_1m",
    "output": "output_price_usd_micros_per_1m",
    "cache_read": "cache_read_price_usd_micros_per_1m",
    "cache_write": "cache_write_price_usd_micros_per_1m",
}


class Tokens(NamedTuple):
    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0


def cost_usd_micros(tokens: Tokens, prices: Prices) -> int:
    """ceil(Σ tokens × price per 1M / 1M), in integers only."""
    scaled = (tokens.input * prices.input + tokens.output * prices.output
              + tokens.cache_read * prices.cache_read + tokens.cache_write * prices.cache_write)
    return -(-scaled // TOKENS_PER_PRICE)


# --- the price of a day ------------------------------------------------------------

class PriceQuote(NamedTuple):
    prices: Prices
    source: str  # PRICING_API | CONFIG_FALLBACK
    version: str  # the day, yyyy-mm-dd
    model_id: str
    region: str | None

    def as_response(self) -> dict:
        return {
            "input_price_usd_micros_per_1m": self.prices.input,
            "output_price_usd_micros_per_1m": self.prices.output,
            "cache_read_price_usd_micros_per_1m": self.prices.cache_read,
            "cache_write_price_usd_micros_per_1m": self.prices.cache_write,
            "version": self.version,
            "source": self.source,
        }


def price_key(day: date, region: str | None = None) -> str:
    return day.isoformat() + (f"#{region}" if region else "")


def _prices_from_item(item: dict, fallback: Prices | None) -> Prices:
    def component(kind: str) -> int:
        value = item.get(PRICE_ATTRIBUTES[kind])
        if value is not None:
            return int(value)
        return getattr(fallback, kind) if fallback else 0

    return Prices(*(component(kind) for kind in ("input", "output", "cache_read", "cache_write")))


_quotes = TTLCache(PRICE_CACHE_SECONDS)


def quote(model_id: str, day: date, region: str | None, fallback: Prices | None) -> PriceQuote:
    """The price of ``day`` for ``model_id`` (region, then default, then ``fallback``).

    One BatchGetItem on a miss, then cached in memory per (model, day, region). With no
    price anywhere the label cannot be metered: 400 ``INVALID_CONFIG``.
    """
    return _quotes.get_or_load((model_id, day, region, fallback), lambda: _load_quote(model_id, day, region, fallback))


def _load_quote(model_id: str, day: date, region: str | None, fallback: Prices | None) -> PriceQuote:
    wanted = [price_key(day, region)] + ([price_key(day)] if region else [])
    found = {item["price_key"]: item for item in batch_get(
        tables.PRICING_CACHE, [{"model_id": model_id, "price_key": key} for key in wanted],
        attributes=["price_key", *PRICE_ATTRIBUTES.values()])}
    for key in wanted:
        if key in found:
            return PriceQuote(_prices_from_item(found[key], fallback), PRICING_API, day.isoformat(), model_id, region)
    if fallback is None:
        raise invalid_config("No price known for this model; add it to config.yaml", model_id=model_id,
                             region=region, date=day.isoformat())
    return PriceQuote(fallback, CONFIG_FALLBACK, day.isoformat(), model_id, region)


# --- the AWS Price List ------------------------------------------------------------

# Price List ``inferenceType`` values of on-demand token prices.
_TOKEN_KINDS = {
    "input tokens": "input",
    "output tokens": "output",
    "cache read input tokens": "cache_read",
    "cache write input tokens": "cache_write",
}
# Usage types of other offers (batch, flex, priority, provisioned, cross-region global...)
# that must not become the on-demand price.
_OTHER_OFFERS = ("batch", "flex", "priority", "latency-optimized", "provisioned", "custom", "global", "cross-region")
_TOKENS_PER_UNIT = {"1k tokens": 1_000, "1m tokens": 1_000_000, "tokens": 1, "token": 1}


def token_kind(attributes: dict) -> str | None:
    """``input``/``output``/``cache_read``/``cache_write`` for an on-demand token product."""
    if attributes.get("feature", "On-demand Inference") != "On-demand Inference":
        return None
    usage_type = attributes.get("usagetype", "").lower()
    if any(offer in usage_type for offer in _OTHER_OFFERS):
        return None
    return _TOKEN_KINDS.get(attributes.get("inferenceType", "").strip().lower())


def micros_per_1m(usd_per_unit: str, unit: str) -> int:
    """A Price List ``pricePerUnit.USD`` for ``unit`` as integer micro-USD per 1M tokens
    (exact decimal arithmetic, rounded half up)."""
    tokens_per_unit = _TOKENS_PER_UNIT[unit.strip().lower()]
    exact = Decimal(usd_per_unit) * MICROS_PER_USD * TOKENS_PER_PRICE / tokens_per_unit
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def parse_price_list(entries: Iterable[str | dict], model_names: set[str]) -> dict[tuple[str, str], Prices]:
    """``{(price list model name, region): Prices}`` for the on-demand token prices of
    ``model_names`` found in GetProducts ``PriceList`` entries (JSON strings). Entries of
    other offers, other models or unknown units are skipped; a model/region needs both an
    input and an output price."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for entry in entries:
        product = json.loads(entry) if isinstance(entry, str) else entry
        attributes = product.get("product", {}).get("attributes", {})
        name, region, kind = attributes.get("model"), attributes.get("regionCode"), token_kind(attributes)
        if name not in model_names or not region or kind is None:
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if usd is None or dimension.get("unit", "").strip().lower() not in _TOKENS_PER_UNIT:
                    continue
                found.setdefault((name, region), {})[kind] = micros_per_1m(usd, dimension["unit"])
    return {
        key: Prices(kinds["input"], kinds["output"], kinds.get("cache_read", 0), kinds.get("cache_write", 0))
        for key, kinds in found.items() if "input" in kinds and "output" in kinds
    }


@lru_cache(maxsize=1)
def pricing_client():
    return boto3.client("pricing", region_name=PRICE_LIST_ENDPOINT_REGION,
                        config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                                      read_timeout=20))


def fetch_price_list(client, model_names: Iterable[str]) -> list[str]:
    """Every AmazonBedrock product of the named models (all regions), paginated."""
    entries: list[str] = []
    paginator = client.get_paginator("get_products")
    for name in sorted(set(model_names)):
        for page in paginator.paginate(ServiceCode=SERVICE_CODE, FormatVersion="aws_v1",
                                       Filters=[{"Type": "TERM_MATCH", "Field": "model", "Value": name}]):
            entries.extend(page.get("PriceList", []))
    return entries


def default_price_region() -> str:
    """The region whose price becomes a model's default ``{yyyy-mm-dd}`` price."""
    return os.environ.get("DEFAULT_PRICE_REGION", "us-east-1")


def pricing_items(prices: dict[tuple[str, str], Prices], now: datetime) -> list[dict]:
    """PricingCache items for every configured model and day that can still be metered:
    ``{day}#{region}`` for each region and ``{day}`` for the default region."""
    labels_by_name: dict[str, list] = {}
    for label in get_config().labels.values():
        if label.type == "model" and label.price_list_model:
            labels_by_name.setdefault(label.price_list_model, []).append(label)
    fetched = int(now.timestamp())
    items: dict[tuple[str, str], dict] = {}
    for (name, region), found in sorted(prices.items()):
        for label in labels_by_name.get(name, []):
            for day in org_days_in_play(now):
                regions = [region] + ([None] if region == default_price_region() else [])
                for key_region in regions:
                    key = (label.id, price_key(day, key_region))
                    items.setdefault(key, {
                        "model_id": label.id, "price_key": key[1], "model_label": label.name, "tier": label.tier,
                        "family": label.family, "description": label.description,
                        **{PRICE_ATTRIBUTES[kind]: getattr(found, kind) for kind in PRICE_ATTRIBUTES},
                        "fetched_at_epoch": fetched,
                        tables.TTL_ATTRIBUTE: fetched + PRICE_TTL_DAYS * 86400,
                    })
    return list(items.values())


def refresh_pricing_cache(now: datetime | None = None, client=None) -> dict:
    """The pricing fetcher: read the Price List, write the days' prices to PricingCache.

    A day's price, once written, is kept (conditional put): usage of a day is priced the
    same whenever it arrives. When the Price List cannot be read, nothing is written and
    the existing cache or the config prices keep serving (the run reports ``unavailable``
    instead of failing, so the schedule does not turn into a crash loop).
    """
    now = now or utc_now()
    names = {label.price_list_model for label in get_config().labels.values()
             if label.type == "model" and label.price_list_model}
    try:
        entries = fetch_price_list(client or pricing_client(), names)
    except (ClientError, BotoCoreError) as error:
        logger.warning("price list unavailable; config prices keep serving", extra={"error_type": type(error).__name__})
        return {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    prices = parse_price_list(entries, names)
    written = kept = 0
    pricing_table = table(tables.PRICING_CACHE)
    for item in pricing_items(prices, now):
        try:
            pricing_table.put_item(Item=item, ConditionExpression="attribute_not_exists(price_key)")
            written += 1
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            kept += 1
    _quotes.clear()
    models = len({name for name, _ in prices})
    logger.info("pricing refreshed", extra={"models": models, "written": written, "kept": kept})
    return {"status": "ok", "written": written, "kept": kept, "models": models}

