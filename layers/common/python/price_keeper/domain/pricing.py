"""Prices and cost maths.

Cost is integer micro-USD computed server-side: every token count times its price (micro-USD
per 1M tokens) is summed exactly in integers and divided by 1M **once**, rounding **up**
(a spend guard never under-counts; the error is below one micro-USD per record).

A price depends on the model, the day, the calling region and the profile kind (in-region,
geographic or global cross-region inference). It comes from PricingCache items
``{yyyy-mm-dd}#{region}`` then ``{yyyy-mm-dd}`` (each holding every kind the Price List
has), then ``config.yaml``; a kind without a price of its own is priced as in-region, and a
model with no price anywhere at the estimate (``ESTIMATE``: each component at least the
highest price the service knows, see ``estimate``). The pricing fetcher fills PricingCache
from the AWS Price List API: daily, and on the first sight of a model outside
``config.yaml``; then it re-prices the records counted at the estimate (``reprice``).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Iterable
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import state
from ..cache import TTLCache
from ..config import GEOGRAPHIC, GLOBAL, IN_REGION, PRICE_FIELDS, Prices, get_config
from ..observability import logger
from ..store import keys, tables
from ..store import prices as price_store
from ..store import usage as usage_store
from ..timeutil import org_days_in_play, utc_now
from . import profiles

TOKENS_PER_PRICE = 1_000_000  # prices are per 1M tokens
MICROS_PER_USD = 1_000_000

PRICING_API = "PRICING_API"
CONFIG_FALLBACK = "CONFIG_FALLBACK"
ESTIMATE = "ESTIMATE"  # a model with no known price, counted at ``estimate()``

PRICE_CACHE_SECONDS = 600
PRICE_TTL_DAYS = 3
PRICE_LIST_ENDPOINT_REGION = "us-east-1"  # the Price List API answers from us-east-1 for every region
SERVICE_CODE = "AmazonBedrock"


def price_attribute(kind: str, component: str) -> str:
    """PricingCache attribute of a price: the seed's names for in-region prices
    (``input_price_usd_micros_per_1m``), prefixed by the kind for cross-region ones
    (``global_input_price_usd_micros_per_1m``)."""
    name = PRICE_FIELDS[component]
    return name if kind == IN_REGION else f"{kind.lower()}_{name}"


PRICE_ATTRIBUTES = [
    price_attribute(kind, component) for kind in (IN_REGION, GEOGRAPHIC, GLOBAL) for component in PRICE_FIELDS
]


class Tokens(NamedTuple):
    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0


def cost_usd_micros(tokens: Tokens, prices: Prices) -> int:
    """ceil(Σ tokens × price per 1M / 1M), in integers only."""
    scaled = (
        tokens.input * prices.input
        + tokens.output * prices.output
        + tokens.cache_read * prices.cache_read
        + tokens.cache_write * prices.cache_write
    )
    return -(-scaled // TOKENS_PER_PRICE)


# --- the price of a day ------------------------------------------------------------


class PriceQuote(NamedTuple):
    prices: Prices
    source: str  # PRICING_API | CONFIG_FALLBACK | ESTIMATE
    version: str  # the day, yyyy-mm-dd
    model_id: str
    region: str | None
    profile_kind: str = IN_REGION

    def as_response(self) -> dict:
        return {
            **{PRICE_FIELDS[component]: getattr(self.prices, component) for component in PRICE_FIELDS},
            "version": self.version,
            "source": self.source,
            "profile_kind": self.profile_kind,
        }


def _prices_from_item(item: dict, kind: str, fill: Prices | None) -> Prices | None:
    """The item's prices of ``kind`` (None when it has none); missing components (e.g. cache
    prices) from ``fill``."""
    if item.get(price_attribute(kind, "input")) is None:
        return None

    def component(name: str) -> int:
        value = item.get(price_attribute(kind, name))
        if value is not None:
            return int(value)
        return getattr(fill, name) if fill else 0

    return Prices(*(component(name) for name in PRICE_FIELDS))


_stored = TTLCache(PRICE_CACHE_SECONDS)


def _stored_items(model_id: str, day: date, region: str | None) -> list[dict]:
    """The day's PricingCache items of the model: the region's, then the default one (one
    BatchGetItem on a miss, then cached in memory per model, day and region)."""

    def load() -> list[dict]:
        wanted = [keys.price_key(day.isoformat(), region)] + ([keys.price_key(day.isoformat())] if region else [])
        return price_store.of_day(model_id, wanted, PRICE_ATTRIBUTES)

    return _stored.get_or_load((model_id, day, region), load)


def quote(
    model_id: str, day: date, region: str | None, kind: str = IN_REGION, configured: dict[str, Prices] | None = None
) -> PriceQuote:
    """The price of ``day`` for ``model_id`` called in ``region`` through a ``kind`` profile.

    ``configured`` holds the config.yaml prices by kind (``Label.configured_prices``; None
    for a model outside config.yaml). For the kind, then (a cross-region kind without a
    price of its own) for IN_REGION: PricingCache (region, then default), then config.yaml.
    Nothing anywhere: the configured estimate, ``ESTIMATE``. Global cross-region inference
    is cheaper than in-region, so pricing it as in-region over-counts, never under-counts.
    """
    items = _stored_items(model_id, day, region)
    for candidate in dict.fromkeys((kind, IN_REGION)):
        fill = (configured.get(candidate) or configured[IN_REGION]) if configured else None
        for item in items:
            prices = _prices_from_item(item, candidate, fill)
            if prices is not None:
                return PriceQuote(prices, PRICING_API, day.isoformat(), model_id, region, kind)
        if configured and candidate in configured:
            return PriceQuote(configured[candidate], CONFIG_FALLBACK, day.isoformat(), model_id, region, kind)
    return PriceQuote(estimate(), ESTIMATE, day.isoformat(), model_id, region, kind)


def estimate() -> Prices:
    """The price of a model with no known price, deliberately high: each component the
    highest of the ``config.yaml`` floor (``unknown_model_estimate``, itself at least every
    label's price) and every on-demand price the fetcher has read from the Price List (of any
    model, Region or kind: PricingCache's ceiling item, cached like the prices). Records
    counted at it are re-priced once the model's price is known (``reprice``)."""
    floor = get_config().unknown_model_estimate
    read = _stored.get_or_load("ceiling", lambda: price_store.ceiling(PRICE_FIELDS.values()))
    return Prices(*(max(getattr(floor, c), int(read.get(PRICE_FIELDS[c], 0))) for c in PRICE_FIELDS))


def price_of(priced: profiles.PricedModel, day: date) -> PriceQuote:
    """The price of ``day`` for what a label bills (``profiles.priced_model``)."""
    return quote(priced.model_id, day, priced.region, priced.profile_kind, priced.configured)


# --- the AWS Price List ------------------------------------------------------------
#
# GetProducts answers every Bedrock product of a model: on-demand token prices per region,
# and the same tokens under other offers, told apart by the usage type (and feature):
#   USE1-NovaPro-input-tokens                        standard, in-region
#   USE1-Claude4.5Sonnet-input-tokens-cross-region-global   global cross-region
#   USE1-NovaPro-input-tokens-batch / -flex / -priority / -latency-optimized ...  other offers
#   USE1-Claude4Sonnet-input-tokens-long-context     long-context tier
#   USE1-Claude4.5Sonnet-cache-write-1h-input-token-count   1-hour cache writes
# Only standard on-demand token prices are kept, per kind.

# Dash-delimited words of an offer that is not the standard on-demand one.
_OTHER_OFFER = re.compile(
    r"(?:^|-)(?:batch|flex|priority|latency-optimized|provisioned|reserved|commitment|custom|training|"
    r"storage|import|long-context|long-ctx|lctx|1h|mantle)(?:-|$)"
)
_GLOBAL_OFFER = re.compile(r"(?:^|-)global(?:-|$)")
_GEOGRAPHIC_OFFER = re.compile(r"(?:^|-)(?:cross-region|geo)(?:-|$)")
_TOKEN_COMPONENTS = (
    ("cache read", "cache_read"),
    ("cache write", "cache_write"),
    ("input", "input"),
    ("output", "output"),
)
_TOKENS_PER_UNIT = {"1k tokens": 1_000, "1m tokens": 1_000_000, "tokens": 1, "token": 1}


def _words(*texts: str) -> str:
    return "-".join(re.sub(r"[\s_]+", "-", text.strip().lower()) for text in texts if text)


def classify(attributes: dict) -> tuple[str, str] | None:
    """(profile kind, token component) of a standard on-demand token product, else None."""
    inference = attributes.get("inferenceType", "").strip().lower()
    component = next((name for prefix, name in _TOKEN_COMPONENTS if inference.startswith(prefix)), None)
    if component is None or "token" not in inference:
        return None
    # the usage type without its region prefix (USE1-), which is not an offer word
    usage = attributes.get("usagetype", "").partition("-")[2]
    words = _words(usage, inference, attributes.get("feature", ""))
    if _OTHER_OFFER.search(words):
        return None
    if _GLOBAL_OFFER.search(words):
        return GLOBAL, component
    if _GEOGRAPHIC_OFFER.search(words):
        return GEOGRAPHIC, component
    return IN_REGION, component


def micros_per_1m(usd_per_unit: str, unit: str) -> int:
    """A Price List ``pricePerUnit.USD`` for ``unit`` as integer micro-USD per 1M tokens
    (exact decimal arithmetic, rounded half up)."""
    tokens_per_unit = _TOKENS_PER_UNIT[unit.strip().lower()]
    exact = Decimal(usd_per_unit) * MICROS_PER_USD * TOKENS_PER_PRICE / tokens_per_unit
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


class PricePoint(NamedTuple):
    """One standard on-demand token price of the Price List, from its term's effective date."""

    model: str  # the Price List model name
    region: str
    kind: str
    component: str
    effective: date
    micros: int


def _effective(term: dict) -> date:
    text = term.get("effectiveDate") or ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).date()
    except ValueError:
        return date.min


def _first_tier(dimensions: Iterable[dict]) -> dict | None:
    """The token dimension starting at 0 tokens (a tiered term's later ranges are not the
    standard price)."""
    tokens = [
        d
        for d in dimensions
        if d.get("unit", "").strip().lower() in _TOKENS_PER_UNIT and d.get("pricePerUnit", {}).get("USD") is not None
    ]
    return min(tokens, key=lambda d: Decimal(d.get("beginRange") or 0), default=None)


def price_points(entries: Iterable[str | dict], model_names: set[str]) -> list[PricePoint]:
    """The standard on-demand token prices of ``model_names`` in GetProducts ``PriceList``
    entries (JSON strings); other offers, models and units are skipped."""
    points = []
    for entry in entries:
        product = json.loads(entry) if isinstance(entry, str) else entry
        attributes = product.get("product", {}).get("attributes", {})
        name, region, classified = attributes.get("model"), attributes.get("regionCode"), classify(attributes)
        if name not in model_names or not region or classified is None:
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            dimension = _first_tier(term.get("priceDimensions", {}).values())
            if dimension is not None:
                points.append(
                    PricePoint(
                        name,
                        region,
                        *classified,
                        _effective(term),
                        micros_per_1m(dimension["pricePerUnit"]["USD"], dimension["unit"]),
                    )
                )
    return points


def prices_on(points: Iterable[PricePoint], day: date) -> dict[tuple[str, str], dict[str, Prices]]:
    """``{(model name, region): {kind: Prices}}`` in effect on ``day``: for each price, the
    term effective latest on or before the day; products that tie (same model, region, kind
    and component) give the highest price, so the choice never depends on the order the API
    answers in and never under-counts. A kind needs both an input and an output price."""
    best: dict[tuple, tuple[date, int]] = {}
    for point in points:
        if point.effective > day:
            continue
        key = (point.model, point.region, point.kind, point.component)
        best[key] = max(best.get(key, (date.min, -1)), (point.effective, point.micros))
    grouped: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    for (model, region, kind, component), (_, micros) in best.items():
        grouped.setdefault((model, region), {}).setdefault(kind, {})[component] = micros
    result = {}
    for key, kinds in grouped.items():
        complete = {
            kind: Prices(c["input"], c["output"], c.get("cache_read", 0), c.get("cache_write", 0))
            for kind, c in kinds.items()
            if "input" in c and "output" in c
        }
        if complete:
            result[key] = complete
    return result


def parse_price_list(
    entries: Iterable[str | dict], model_names: set[str], day: date
) -> dict[tuple[str, str], dict[str, Prices]]:
    """The standard on-demand token prices of ``model_names`` in effect on ``day``."""
    return prices_on(price_points(entries, model_names), day)


@lru_cache(maxsize=1)
def pricing_client():
    return boto3.client(
        "pricing",
        region_name=PRICE_LIST_ENDPOINT_REGION,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=20),
    )


state.kept(pricing_client.cache_clear)


def fetch_price_list(client, model_names: Iterable[str]) -> list[str]:
    """Every AmazonBedrock product of the named models (all regions), paginated."""
    entries: list[str] = []
    paginator = client.get_paginator("get_products")
    for name in sorted(set(model_names)):
        for page in paginator.paginate(
            ServiceCode=SERVICE_CODE,
            FormatVersion="aws_v1",
            Filters=[{"Type": "TERM_MATCH", "Field": "model", "Value": name}],
        ):
            entries.extend(page.get("PriceList", []))
    return entries


def default_price_region() -> str:
    """The region whose price becomes a model's default ``{yyyy-mm-dd}`` price (a label reported
    without ``calling_region``): the stack's own (Lambda's ``AWS_REGION``) unless set."""
    return os.environ.get("DEFAULT_PRICE_REGION") or os.environ.get("AWS_REGION") or "us-east-1"


class PricedModelId(NamedTuple):
    """A Bedrock model id the fetcher prices, under its Price List name, with the config
    label's descriptive attributes (empty for a model outside config.yaml)."""

    model_id: str
    price_list_model: str
    details: dict


def configured_models() -> list[PricedModelId]:
    return [
        PricedModelId(
            label.id,
            label.price_list_model,
            {"model_label": label.name, "tier": label.tier, "family": label.family, "description": label.description},
        )
        for label in get_config().labels.values()
        if label.type == "model" and label.price_list_model
    ]


def pricing_items(points: list[PricePoint], models: list[PricedModelId], now: datetime) -> list[dict]:
    """PricingCache items for ``models`` and every day that can still be metered, each day
    priced by the terms in effect on it: ``{day}#{region}`` for each region and ``{day}``
    for the default region, with the prices of every kind found."""
    fetched = int(now.timestamp())
    items: dict[tuple[str, str], dict] = {}
    for day in org_days_in_play(now):
        for (name, region), kinds in sorted(prices_on(points, day).items()):
            for model in (model for model in models if model.price_list_model == name):
                for key_region in [region] + ([None] if region == default_price_region() else []):
                    key = (model.model_id, keys.price_key(day.isoformat(), key_region))
                    items.setdefault(
                        key,
                        {
                            "model_id": model.model_id,
                            "price_key": key[1],
                            **model.details,
                            **{
                                price_attribute(kind, component): getattr(prices, component)
                                for kind, prices in kinds.items()
                                for component in PRICE_FIELDS
                            },
                            "fetched_at_epoch": fetched,
                            tables.TTL_ATTRIBUTE: fetched + PRICE_TTL_DAYS * 86400,
                        },
                    )
    return list(items.values())


def _store(item: dict) -> bool:
    """Add the item's prices to the day's PricingCache item; False when it had them all.

    Every attribute is written only if absent (``if_not_exists``): a price, once written
    for a day, is kept, so usage of a day is priced the same whenever it arrives, while a
    kind or component learned later (a new cross-region offer, a model first seen
    mid-day) is still added. The condition skips the write when nothing is new.
    """
    return price_store.add_missing(item, PRICE_ATTRIBUTES)


def _write(points: list[PricePoint], models: list[PricedModelId], now: datetime) -> dict:
    written = kept = 0
    for item in pricing_items(points, models, now):
        if _store(item):
            written += 1
        else:
            kept += 1
    highest: dict[str, int] = {}
    for point in points:  # every on-demand price read, of any model, Region or kind
        name = PRICE_FIELDS[point.component]
        highest[name] = max(highest.get(name, 0), point.micros)
    price_store.raise_ceiling(highest)
    _stored.clear()
    return {"written": written, "kept": kept, "models": len({point.model for point in points})}


def _price_list_points(client, names: set[str]) -> list[PricePoint] | None:
    """The Price List's points for ``names``; None (logged) when it cannot be read."""
    try:
        return price_points(fetch_price_list(client or pricing_client(), names), names)
    except (ClientError, BotoCoreError) as error:
        logger.warning(
            "price list unavailable; stored and config prices keep serving", extra={"error_type": type(error).__name__}
        )
        return None


def refresh_pricing_cache(now: datetime | None = None, client=None) -> dict:
    """The daily run: read the Price List for every configured model and every model
    outside config.yaml seen since (``store.prices.registered_models``), add the days' prices to
    PricingCache (``_store``), then re-price the registered models' records counted at the
    estimate (``reprice_estimates``; a configured model always has a config price).

    When the Price List cannot be read, nothing is written and the stored or config prices
    keep serving (the run reports ``unavailable`` instead of failing, so the schedule does
    not turn into a crash loop).
    """
    now = now or utc_now()
    registered = sorted(price_store.registered_models().items())
    models = configured_models() + [PricedModelId(model_id, name, {}) for model_id, name in registered]
    points = _price_list_points(client, {model.price_list_model for model in models})
    if points is None:
        return {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    report = {"status": "ok", **_write(points, models, now)}
    report["repriced"] = reprice_estimates(model_id for model_id, _ in registered)
    logger.info("pricing refreshed", extra=report)
    return report


# --- models outside config.yaml -------------------------------------------------------


def price_list_name(model_id: str, region: str) -> str | None:
    """The model's Price List name: Bedrock's ``modelName`` (GetFoundationModel) in
    ``region``; None (logged) when Bedrock does not answer it."""
    try:
        reply = profiles.bedrock_client(region).get_foundation_model(modelIdentifier=model_id)
    except (ClientError, BotoCoreError) as error:
        logger.warning(
            "foundation model name unavailable", extra={"model_id": model_id, "error_type": type(error).__name__}
        )
        return None
    return reply["modelDetails"]["modelName"]


def price_unpriced_model(model_id: str, region: str | None, now: datetime | None = None, client=None) -> dict:
    """First sight of a model outside config.yaml (its ``UNPRICED_MODEL`` alert event):
    look its prices up at once and register it for the daily run. A model already
    registered is left to the daily run (the alert fires once per scope and day, so many
    first sights may arrive)."""
    now = now or utc_now()
    if model_id in price_store.registered_models():  # priced already: only records counted meanwhile
        return {"status": "registered", "written": 0, "kept": 0, "models": 0, "repriced": reprice_estimates([model_id])}
    name = price_list_name(model_id, region if region and profiles.is_known_region(region) else default_price_region())
    if name is None:
        return {"status": "unresolved", "written": 0, "kept": 0, "models": 0}
    points = _price_list_points(client, {name})
    if points is None:
        return {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    report = {"status": "ok", **_write(points, [PricedModelId(model_id, name, {})], now)}
    price_store.register_model(model_id, name)
    report["repriced"] = reprice_estimates([model_id])
    logger.info("unpriced model looked up", extra={"model_id": model_id, "price_list_model": name, **report})
    return report


# --- re-pricing what was counted at the estimate ---------------------------------------

REPRICE_ATTEMPTS = 5


def reprice(pending: dict, now: datetime) -> bool:
    """Correct one record counted at the estimate (``store.usage.estimated_records``) to its
    day's price, exactly once; False when its price is still unknown, it was corrected
    before (by a re-run, an overlapping run, or a retry) or it was voided."""
    tokens = Tokens(*(int(pending[name]) for name in Tokens._fields))
    day = datetime.strptime(pending["org_day"], "%Y%m%d").date()
    known = quote(pending["model_id"], day, pending.get("region"), pending.get("profile_kind", IN_REGION))
    if known.source == ESTIMATE:
        return False
    delta = cost_usd_micros(tokens, known.prices) - int(pending["cost_usd_micros"])
    now_epoch = int(now.timestamp())
    kept_until = get_config().metering.marker_expires_at(now_epoch)  # as any marker, from now on
    for attempt in range(REPRICE_ATTEMPTS):
        try:
            return usage_store.reprice_once(pending, delta, known.source, now_epoch, kept_until, attempt)
        except usage_store.Conflict:
            time.sleep(min(0.5, 0.02 * 2**attempt) * random.uniform(0.5, 1.0))
    raise RuntimeError("re-pricing kept conflicting with concurrent usage writes")  # the next run retries


class RepricingFailed(Exception):
    """Re-pricing some models failed (each logged); the others were re-priced. Raised after
    them all, so the invocation fails and is retried, the retry finding only what is left."""


def reprice_estimates(model_ids: Iterable[str], now: datetime | None = None) -> int:
    """Re-price every record of ``model_ids`` counted at the estimate whose price is known
    now (``reprice``), a page at a time; how many were corrected. A model that fails does
    not stop the others (``RepricingFailed`` once they are done). The aggregator folds the
    corrections into the day's totals like any shard change."""
    now = now or utc_now()
    _stored.clear()  # the prices just written, not a quote cached before
    corrected, failed = 0, []
    for model_id in model_ids:
        try:
            for pending in usage_store.estimated_records(model_id):
                corrected += reprice(pending, now)
        except Exception:  # noqa: BLE001 - one model's records must not hold back the others'
            logger.exception("re-pricing a model failed; the other models go on", extra={"model_id": model_id})
            failed.append(model_id)
    if corrected:
        logger.info("estimated records re-priced", extra={"repriced": corrected})
    if failed:
        raise RepricingFailed(failed)
    return corrected
