"""The AWS Price List: Bedrock's token prices as GetProducts answers them, read into
``PricePoint``s (what each product is: its model, Region, profile kind, token component and
offer, from its usage type, inference type and feature; its price from its term's first tier).
Which point applies on a day is ``domain.pricing``'s rule."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import config, state
from ..config import GEOGRAPHIC, GLOBAL, IN_REGION, STANDARD, TOKENS_PER_PRICE
from ..observability import logger

MICROS_PER_USD = 1_000_000
ENDPOINT_REGION = "us-east-1"  # the Price List API answers from us-east-1 for every region
SERVICE_CODE = "AmazonBedrock"

# GetProducts answers every Bedrock product of a model: on-demand token prices per region,
# and the same tokens under other offers, told apart by the usage type, the inference type
# and the feature (the names as the Price List has them):
#   USE1-NovaPro-input-tokens                                   standard, in-region
#   USE1-Claude4.5Sonnet-input-tokens-cross-region-global       global cross-region
#   USE1-Qwen3-32B-input-tokens-priority / -flex                service tiers
#   USW2-Nova2.0Lite-input-tokens-priority-cross-region-global  a tier, global cross-region
#   USE1-Qwen3-32B-input-tokens-batch (feature "Batch Inference")  batch inference
#   USE1-Claude4Sonnet-input-tokens-long-context-cross-region-global  the long-context rate
#   USE1-Claude4.5Sonnet-cache-write-1h-input-token-count       1-hour cache writes
#   USE1-Llama3-1-70B-LatencyOptimized-input-tokens (model "Llama 3.1 70B Latency Optimized")
# Token prices of each kind and offer are kept; capacity, customization and storage are not.

# Dash-delimited words of a product that is not a token price of an on-demand or batch call.
_NOT_TOKENS = re.compile(
    r"(?:^|-)(?:provisioned|provisionedthroughput|reserved|commitment|custom|customization|training|storage|import|"
    r"mantle|per-minute)(?:-|$)"
)
_GLOBAL_OFFER = re.compile(r"(?:^|-)global(?:-|$)")
_GEOGRAPHIC_OFFER = re.compile(r"(?:^|-)(?:cross-region|geo)(?:-|$)")
_WORD = {
    config.PRIORITY: re.compile(r"(?:^|-)priority(?:-|$)"),
    config.FLEX: re.compile(r"(?:^|-)flex(?:-|$)"),
    config.BATCH: re.compile(r"(?:^|-)batch(?:-|$)"),
    config.LATENCY_OPTIMIZED: re.compile(r"(?:^|-)(?:latencyoptimized|latency-optimized)(?:-|$)"),
    config.LONG_CONTEXT: re.compile(r"(?:^|-)(?:long-context|longcontext|long-ctx|lctx)(?:-|$)"),
}
_ONE_HOUR = re.compile(r"(?:^|-)1h(?:-|$)")
LATENCY_OPTIMIZED_MODEL = " Latency Optimized"  # the Price List's model name of a model's latency-optimized offer
_TOKEN_COMPONENTS = (
    ("cache read", "cache_read"),
    ("cache write", "cache_write"),
    ("input", "input"),
    ("output", "output"),
)
_USAGE_COMPONENTS = (  # a product without an inference type: its usage type names the tokens
    ("cache-read", "cache_read"),
    ("cache-write", "cache_write"),
    ("input-token", "input"),
    ("output-token", "output"),
)
_TOKENS_PER_UNIT = {"1k tokens": 1_000, "1m tokens": 1_000_000, "tokens": 1, "token": 1}


def _words(*texts: str) -> str:
    return "-".join(re.sub(r"[\s_]+", "-", text.strip().lower()) for text in texts if text)


class Classified(NamedTuple):
    kind: str
    component: str
    offer: str = STANDARD


def _offer(words: str) -> str | None:
    """The offer a product's words name; None for a combination Bedrock does not bill."""
    named = [offer for offer, word in _WORD.items() if word.search(words)]
    long = config.LONG_CONTEXT in named
    rest = [offer for offer in named if offer != config.LONG_CONTEXT]
    if len(rest) > 1 or (long and rest == [config.LATENCY_OPTIMIZED]):
        return None
    base = rest[0] if rest else STANDARD
    return config.long_offer(base) if long else base


def classify(attributes: dict) -> Classified | None:
    """(profile kind, token component, offer) of an on-demand or batch token product, else None."""
    inference = attributes.get("inferenceType", "").strip().lower()
    # the usage type without its region prefix (USE1-), which is not an offer word
    usage = attributes.get("usagetype", "").partition("-")[2]
    words = _words(usage, inference, attributes.get("feature", ""))
    if inference:
        component = next((name for prefix, name in _TOKEN_COMPONENTS if inference.startswith(prefix)), None)
        tokens = "token" in inference
    else:
        component = next((name for word, name in _USAGE_COMPONENTS if word in usage.lower()), None)
        tokens = component is not None
    if component is None or not tokens or _NOT_TOKENS.search(words):
        return None
    if attributes.get("model", "").endswith(LATENCY_OPTIMIZED_MODEL):
        words += "-latency-optimized"
    offer = _offer(words)
    if offer is None:
        return None
    if component == "cache_write" and _ONE_HOUR.search(words):
        component = "cache_write_1h"
    if _GLOBAL_OFFER.search(words):
        return Classified(GLOBAL, component, offer)
    if _GEOGRAPHIC_OFFER.search(words):
        return Classified(GEOGRAPHIC, component, offer)
    return Classified(IN_REGION, component, offer)


def micros_per_1m(usd_per_unit: str, unit: str) -> int:
    """A Price List ``pricePerUnit.USD`` for ``unit`` as micro-USD per 1M tokens, rounded half up."""
    tokens_per_unit = _TOKENS_PER_UNIT[unit.strip().lower()]
    exact = Decimal(usd_per_unit) * MICROS_PER_USD * TOKENS_PER_PRICE / tokens_per_unit
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


class PricePoint(NamedTuple):
    """One token price of the Price List, from its term's effective date."""

    model: str  # the Price List model name (a latency-optimized offer's: its model's)
    region: str
    kind: str
    component: str
    effective: date
    micros: int
    offer: str = STANDARD


def _effective(term: dict) -> date:
    text = term.get("effectiveDate") or ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).date()
    except ValueError:
        return date.min


def _first_tier(dimensions: Iterable[dict]) -> dict | None:
    """The token dimension starting at 0 tokens (a tiered term's standard price)."""
    tokens = [
        d
        for d in dimensions
        if d.get("unit", "").strip().lower() in _TOKENS_PER_UNIT and d.get("pricePerUnit", {}).get("USD") is not None
    ]
    return min(tokens, key=lambda d: Decimal(d.get("beginRange") or 0), default=None)


def price_points(entries: Iterable[str | dict], model_names: set[str]) -> list[PricePoint]:
    """The token prices of ``model_names`` in GetProducts ``PriceList`` entries; others are skipped."""
    points = []
    for entry in entries:
        product = json.loads(entry) if isinstance(entry, str) else entry
        attributes = product.get("product", {}).get("attributes", {})
        name, region, classified = attributes.get("model") or "", attributes.get("regionCode"), classify(attributes)
        name = name.removesuffix(LATENCY_OPTIMIZED_MODEL)
        if name not in model_names or not region or classified is None:
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            dimension = _first_tier(term.get("priceDimensions", {}).values())
            if dimension is not None:
                points.append(
                    PricePoint(
                        name,
                        region,
                        classified.kind,
                        classified.component,
                        _effective(term),
                        micros_per_1m(dimension["pricePerUnit"]["USD"], dimension["unit"]),
                        classified.offer,
                    )
                )
    return points


@lru_cache(maxsize=1)
def pricing_client():
    return boto3.client(
        "pricing",
        region_name=ENDPOINT_REGION,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=20),
    )


state.kept(pricing_client.cache_clear)


def price_list_queries(model_names: Iterable[str]) -> list[str]:
    """Each model's Price List name, then its latency-optimized offer's (listed as a model of its own)."""
    return [query for name in sorted(set(model_names)) for query in (name, name + LATENCY_OPTIMIZED_MODEL)]


def fetch_price_list(client, model_names: Iterable[str]) -> list[str]:
    """Every AmazonBedrock product of the named models (all regions), paginated."""
    entries: list[str] = []
    paginator = client.get_paginator("get_products")
    for name in price_list_queries(model_names):
        for page in paginator.paginate(
            ServiceCode=SERVICE_CODE,
            FormatVersion="aws_v1",
            Filters=[{"Type": "TERM_MATCH", "Field": "model", "Value": name}],
        ):
            entries.extend(page.get("PriceList", []))
    return entries


def read_points(names: set[str], client=None) -> list[PricePoint] | None:
    """The Price List's points for ``names``; None (logged) when it cannot be read."""
    try:
        return price_points(fetch_price_list(client or pricing_client(), names), names)
    except (ClientError, BotoCoreError) as error:
        logger.warning(
            "price list unavailable; stored and config prices keep serving", extra={"error_type": type(error).__name__}
        )
        return None
