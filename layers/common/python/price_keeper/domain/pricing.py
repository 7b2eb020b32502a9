"""Prices and cost maths: cost is integer micro-USD, Σ tokens × price (micro-USD per 1M tokens) in integers, divided
by 1M once and rounded up, so a spend guard never under-counts.

A price depends on the model, the day, the calling region, the profile kind and the offer (``Dimensions``; long
context from the tokens). It comes from PricingCache (``{day}#{region}``, then ``{day}``), then ``config.yaml``; a
kind without its own price is priced as in-region, and a rate with no price anywhere at the deliberately high
``estimate`` (``ESTIMATE``), re-priced once the fetcher learns it (``reprice``). See docs/metering.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import date, datetime
from typing import NamedTuple

from ..aws import bedrock, price_list
from ..aws.price_list import PricePoint
from ..cache import TTLCache
from ..config import (
    BATCH,
    DEFAULT_LONG_CONTEXT_THRESHOLD,
    FLEX,
    GEOGRAPHIC,
    GLOBAL,
    IN_REGION,
    LATENCY_OPTIMIZED,
    LONG_CONTEXT,
    OFFERS,
    PRICE_FIELDS,
    PRIORITY,
    STANDARD,
    TOKENS_PER_PRICE,
    Prices,
    completed,
    get_config,
    long_offer,
    offer_key,
)
from ..observability import logger
from ..store import keys, tables
from ..store import prices as price_store
from ..store import usage as usage_store
from ..timeutil import org_days_in_play, retry_pause, utc_now
from . import profiles

PRICING_API = "PRICING_API"
CONFIG_FALLBACK = "CONFIG_FALLBACK"
ESTIMATE = "ESTIMATE"  # a model (or a dimension of it) with no known price, counted at ``estimate()``
RESERVED = "RESERVED"  # a call on the reserved tier: prepaid capacity, 0 marginal cost
_WORST = (PRICING_API, CONFIG_FALLBACK, ESTIMATE)  # a price made of several: its least sure source

PRICE_CACHE_SECONDS = 600
PRICE_TTL_DAYS = 3
KINDS = (IN_REGION, GEOGRAPHIC, GLOBAL)


def price_attribute(kind: str, component: str, offer: str = STANDARD) -> str:
    """PricingCache attribute of a price, e.g. ``global_priority_input_price_usd_micros_per_1m``."""
    name = PRICE_FIELDS[component]
    return ("" if kind == IN_REGION else f"{kind.lower()}_") + ("" if offer == STANDARD else f"{offer}_") + name


PRICE_ATTRIBUTES = [
    price_attribute(kind, component, offer) for offer in OFFERS for kind in KINDS for component in PRICE_FIELDS
]


class Tokens(NamedTuple):
    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0  # every cache write, the 1-hour ones included
    cache_write_1h: int = 0  # the part of ``cache_write`` written with the 1-hour TTL

    @property
    def prompt(self) -> int:
        """The request's input tokens, as a long-context threshold counts them."""
        return self.input + self.cache_read + self.cache_write


def cost_usd_micros(tokens: Tokens, prices: Prices) -> int:
    """ceil(Σ tokens × price per 1M / 1M), in integers only."""
    scaled = (
        tokens.input * prices.input
        + tokens.output * prices.output
        + tokens.cache_read * prices.cache_read
        + (tokens.cache_write - tokens.cache_write_1h) * prices.cache_write
        + tokens.cache_write_1h * prices.cache_write_1h
    )
    return -(-scaled // TOKENS_PER_PRICE)


ON_DEMAND, BATCH_INFERENCE = "ON_DEMAND", "BATCH"  # the wire's values: bodies.CallDimensions


class Dimensions(NamedTuple):
    """How a call was made (usage record or reservation): what selects its rates beside the model."""

    service_tier: str = "default"
    latency_optimized: bool = False
    inference_type: str = ON_DEMAND

    @classmethod
    def of(cls, body) -> Dimensions:
        """A usage record's or a reservation's (defaults for what it leaves out)."""
        return cls(*(getattr(body, name, default) for name, default in cls._field_defaults.items()))

    @classmethod
    def from_item(cls, item: dict) -> Dimensions:
        """A dedup marker's or an estimated item's (defaults for what it leaves out)."""
        return cls(*(type(default)(item.get(name, default)) for name, default in cls._field_defaults.items()))

    def as_item(self) -> dict:
        return self._asdict()

    @property
    def offer(self) -> str:
        """The offer whose rates apply (before long context and latency-optimized inference)."""
        if self.inference_type == BATCH_INFERENCE:
            return BATCH
        return self.service_tier if self.service_tier in (PRIORITY, FLEX) else STANDARD


DEFAULT_DIMENSIONS = Dimensions()


class PriceQuote(NamedTuple):
    prices: Prices
    source: str  # PRICING_API | CONFIG_FALLBACK | ESTIMATE | RESERVED
    version: str  # the day, yyyy-mm-dd
    model_id: str
    region: str | None
    profile_kind: str = IN_REGION
    dimensions: Dimensions = DEFAULT_DIMENSIONS
    long_context: bool = False  # the request was over the model's long-context threshold

    def as_response(self) -> dict:
        """The selection's ``pricing`` (standard on-demand prices)."""
        return {
            **{PRICE_FIELDS[component]: getattr(self.prices, component) for component in SELECTION_COMPONENTS},
            "version": self.version,
            "source": self.source,
            "profile_kind": self.profile_kind,
        }

    def applied(self) -> dict:
        """Which rates a record was priced at (the usage reply's ``pricing``)."""
        return {
            **self.dimensions.as_item(),
            "long_context": self.long_context,
            "rates": {PRICE_FIELDS[component]: getattr(self.prices, component) for component in PRICE_FIELDS},
        }

    def marker_fields(self) -> dict:
        """How the call was made, as a marker keeps it: only what is not the default."""
        fields = {**self.dimensions.as_item(), "long_context": self.long_context}
        defaults = {**DEFAULT_DIMENSIONS.as_item(), "long_context": False}
        return {name: value for name, value in fields.items() if value != defaults[name]}


SELECTION_COMPONENTS = ("input", "output", "cache_read", "cache_write")


def applied_from_marker(marker: dict) -> dict:
    """``PriceQuote.applied`` for a duplicate, from its marker: dimensions and long context, no rates."""
    return {**Dimensions.from_item(marker).as_item(), "long_context": bool(marker.get("long_context", False))}


def _zero_filled(components: dict[str, int]) -> Prices:
    return Prices(**{**dict.fromkeys(PRICE_FIELDS, 0), **components})


def _prices_from_item(item: dict, kind: str, fill: Prices | None, offer: str = STANDARD) -> Prices | None:
    """The item's prices of ``kind`` and ``offer`` (None when it has none); missing components from ``fill``."""
    if item.get(price_attribute(kind, "input", offer)) is None:
        return None

    def component(name: str) -> int:
        value = item.get(price_attribute(kind, name, offer))
        if value is not None:
            return int(value)
        return getattr(fill, name) if fill else 0

    return Prices(*(component(name) for name in PRICE_FIELDS))


_stored = TTLCache(PRICE_CACHE_SECONDS)


def _stored_items(model_id: str, day: date, region: str | None) -> list[dict]:
    """The day's PricingCache items of the model, the region's then the default (cached in memory)."""

    def load() -> list[dict]:
        wanted = [keys.price_key(day.isoformat(), region)] + ([keys.price_key(day.isoformat())] if region else [])
        return price_store.of_day(model_id, wanted, PRICE_ATTRIBUTES)

    return _stored.get_or_load((model_id, day, region), load)


class _Card(NamedTuple):
    prices: Prices
    source: str


def _fill(item: dict, kind: str, configured: Prices | None) -> Prices | None:
    """Where a standard price of ``kind`` takes the components the Price List lacks: config.yaml;
    a cross-region 1-hour write price neither has, the in-region one's (never under-counts)."""
    in_region = _prices_from_item(item, IN_REGION, None) if kind != IN_REGION else None
    if in_region is None or (configured and configured.cache_write_1h):
        return configured
    return (configured or in_region)._replace(cache_write_1h=in_region.cache_write_1h)


def _lookup(items: list[dict], configured: dict[str, Prices] | None, kind: str, offer: str) -> _Card | None:
    """An offer's prices for ``kind``, then for IN_REGION: PricingCache, then config.yaml. Missing components come
    from config.yaml's prices of the offer, else the standard ones at the offer's input ratio (``completed``)."""
    for candidate in dict.fromkeys((kind, IN_REGION)):
        standard = (configured.get(candidate) or configured[IN_REGION]) if configured else None
        own = configured.get(offer_key(candidate, offer)) if configured else None
        for item in items:
            if offer == STANDARD:
                prices = _prices_from_item(item, candidate, _fill(item, candidate, standard))
                if prices is not None:
                    return _Card(prices, PRICING_API)
                continue
            given = {c: int(item[name]) for c in PRICE_FIELDS if (name := price_attribute(candidate, c, offer)) in item}
            if "input" not in given:
                continue
            if own is not None:
                return _Card(Prices(*(given.get(c, getattr(own, c)) for c in PRICE_FIELDS)), PRICING_API)
            base = _prices_from_item(item, candidate, standard) or standard
            return _Card(completed(given, base) if base else _zero_filled(given), PRICING_API)
        if own is not None:
            return _Card(own, CONFIG_FALLBACK)
    return None


def _offer_card(items: list[dict], configured: dict[str, Prices] | None, kind: str, offer: str) -> _Card | None:
    """``_lookup``; an unlisted tier long-context rate is derived as tier × long-context / standard."""
    found = _lookup(items, configured, kind, offer)
    if found is not None or not offer.endswith(LONG_CONTEXT) or offer == LONG_CONTEXT:
        return found
    parts = [_lookup(items, configured, kind, name) for name in (offer.removesuffix(f"_{LONG_CONTEXT}"), LONG_CONTEXT)]
    standard = _lookup(items, configured, kind, STANDARD)
    if None in parts or standard is None:
        return None
    tier, long = parts
    derived = Prices(
        *(
            -(-t * lc // s) if s else max(t, lc)
            for t, lc, s in zip(tier.prices, long.prices, standard.prices, strict=True)
        )
    )
    return _Card(derived, max(tier.source, long.source, standard.source, key=_WORST.index))


def _highest_of(cards: list[_Card]) -> _Card:
    """Rates that apply together without a joint price: each component at the highest."""
    return _Card(
        Prices(*(max(values) for values in zip(*(card.prices for card in cards), strict=True))),
        max((card.source for card in cards), key=_WORST.index),
    )


def long_context_threshold(model_id: str) -> tuple[int, bool]:
    """(the model's long-context threshold in input tokens, whether config.yaml declares it)."""
    for label in get_config().labels.values():
        if label.id == model_id and label.long_context_threshold_tokens:
            return label.long_context_threshold_tokens, True
    return DEFAULT_LONG_CONTEXT_THRESHOLD, False


def quote(
    model_id: str,
    day: date,
    region: str | None,
    kind: str = IN_REGION,
    configured: dict[str, Prices] | None = None,
    dimensions: Dimensions = DEFAULT_DIMENSIONS,
    tokens: Tokens | None = None,
    reserved_at_on_demand: bool = False,
) -> PriceQuote:
    """The price of ``day`` for ``model_id`` in ``region`` through a ``kind`` profile, called as ``dimensions`` says
    with ``tokens``; ``configured``: config.yaml prices by kind and offer. The reserved tier costs 0 (``RESERVED``)
    unless ``reserved_at_on_demand`` (config ``reserved_tier``)."""
    tokens = tokens or Tokens(0, 0)
    base = dimensions.offer
    if dimensions.service_tier == "reserved" and not reserved_at_on_demand:
        return PriceQuote(Prices(0, 0), RESERVED, day.isoformat(), model_id, region, kind, dimensions)
    items = _stored_items(model_id, day, region)
    threshold, declared = long_context_threshold(model_id)
    long = tokens.prompt > threshold and (declared or _offer_card(items, configured, kind, LONG_CONTEXT) is not None)
    offers = [long_offer(base) if long else base] + ([LATENCY_OPTIMIZED] if dimensions.latency_optimized else [])
    cards = [_offer_card(items, configured, kind, offer) for offer in offers]
    if None not in cards:
        card = _highest_of(cards)
        if not (tokens.cache_write_1h and not card.prices.cache_write_1h):
            return PriceQuote(card.prices, card.source, day.isoformat(), model_id, region, kind, dimensions, long)
    prices = _highest_of([_Card(estimate(offer), ESTIMATE) for offer in offers]).prices
    return PriceQuote(prices, ESTIMATE, day.isoformat(), model_id, region, kind, dimensions, long)


def estimate(offer: str = STANDARD) -> Prices:
    """The price of a rate with no known price, deliberately high: each component the highest of config.yaml's floors
    and every price the fetcher has read (PricingCache's ceiling item)."""
    config = get_config()
    floors = [config.unknown_model_estimate, config.unknown_model_offer_estimates.get(offer, Prices(0, 0))]
    read = _stored.get_or_load("ceiling", lambda: price_store.ceiling(PRICE_FIELDS.values()))
    highest = Prices(
        *(max(*(getattr(floor, c) for floor in floors), int(read.get(PRICE_FIELDS[c], 0))) for c in PRICE_FIELDS)
    )
    return highest._replace(cache_write_1h=max(highest.cache_write_1h, 2 * highest.input))


def price_of(
    priced: profiles.PricedModel,
    day: date,
    dimensions: Dimensions = DEFAULT_DIMENSIONS,
    tokens: Tokens | None = None,
    org_id: str | None = None,
) -> PriceQuote:
    at_on_demand = org_id is not None and get_config().reserved_tier.at_on_demand(org_id)
    return quote(
        priced.model_id, day, priced.region, priced.profile_kind, priced.configured, dimensions, tokens, at_on_demand
    )


def prices_on(points: Iterable[PricePoint], day: date) -> dict[tuple[str, str], dict[str, Prices]]:
    """``{(model name, region): {offer_key(kind, offer): Prices}}`` in effect on ``day``: the latest
    term on or before it, ties at the highest price (order-independent, never under-counts). A card
    needs input and output; an offer's missing components follow its kind's standard ones."""
    best: dict[tuple, tuple[date, int]] = {}
    for point in points:
        if point.effective > day:
            continue
        key = (point.model, point.region, offer_key(point.kind, point.offer), point.component)
        best[key] = max(best.get(key, (date.min, -1)), (point.effective, point.micros))
    grouped: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    for (model, region, card, component), (_, micros) in best.items():
        grouped.setdefault((model, region), {}).setdefault(card, {})[component] = micros
    result = {}
    for key, cards in grouped.items():
        complete = {
            card: _zero_filled(c) for card, c in cards.items() if "/" not in card and "input" in c and "output" in c
        }
        for card, c in cards.items():
            standard = complete.get(card.partition("/")[0]) or complete.get(IN_REGION)
            if "/" in card and "input" in c and "output" in c:
                complete[card] = completed(c, standard) if standard else _zero_filled(c)
        if complete:
            result[key] = complete
    return result


def default_price_region() -> str:
    """The region whose price becomes a model's default ``{yyyy-mm-dd}`` price: the stack's unless set."""
    return os.environ.get("DEFAULT_PRICE_REGION") or os.environ.get("AWS_REGION") or "us-east-1"


class PricedModelId(NamedTuple):
    """A model the fetcher prices: its Price List name and config label details (empty outside config.yaml)."""

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


def _card_attribute(card: str, component: str) -> str:
    """``price_attribute`` of a component of an ``offer_key`` card (``kind`` or ``kind/offer``)."""
    kind, _, offer = card.partition("/")
    return price_attribute(kind, component, offer or STANDARD)


def pricing_items(points: list[PricePoint], models: list[PricedModelId], now: datetime) -> list[dict]:
    """PricingCache items (``{day}#{region}``, and ``{day}`` for the default region) of every day in play."""
    fetched = int(now.timestamp())
    items: dict[tuple[str, str], dict] = {}
    for day in org_days_in_play(now):
        for (name, region), cards in sorted(prices_on(points, day).items()):
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
                                _card_attribute(card, component): getattr(prices, component)
                                for card, prices in cards.items()
                                for component in PRICE_FIELDS
                                # a 1-hour write price the Price List lacks is left to config.yaml
                                if component != "cache_write_1h" or prices.cache_write_1h
                            },
                            "fetched_at_epoch": fetched,
                            tables.TTL_ATTRIBUTE: fetched + PRICE_TTL_DAYS * 86400,
                        },
                    )
    return list(items.values())


def _write(points: list[PricePoint], models: list[PricedModelId], now: datetime) -> dict:
    """Add the days' prices to PricingCache. A price once written for a day is kept (only absent
    attributes are written), so a day's usage is priced the same whenever it arrives."""
    written = kept = 0
    for item in pricing_items(points, models, now):
        if price_store.add_missing(item, PRICE_ATTRIBUTES):
            written += 1
        else:
            kept += 1
    highest: dict[str, int] = {}
    for point in points:  # every token price read, of any model, Region, kind or offer
        name = PRICE_FIELDS[point.component]
        highest[name] = max(highest.get(name, 0), point.micros)
    price_store.raise_ceiling(highest)
    _stored.clear()
    return {"written": written, "kept": kept, "models": len({point.model for point in points})}


def refresh_pricing_cache(now: datetime | None = None, client=None) -> dict:
    """The daily run: price every configured and registered model from the Price List, then re-price their estimated
    records. An unreadable Price List reports ``unavailable`` rather than failing: the schedule does not crash-loop."""
    now = now or utc_now()
    registered = sorted(price_store.registered_models().items())
    models = configured_models() + [PricedModelId(model_id, name, {}) for model_id, name in registered]
    points = price_list.read_points({model.price_list_model for model in models}, client)
    if points is None:
        return {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    report = {"status": "ok", **_write(points, models, now)}
    report["repriced"] = reprice_estimates(dict.fromkeys(model.model_id for model in models))
    logger.info("pricing refreshed", extra=report)
    return report


def price_unpriced_model(model_id: str, region: str | None, now: datetime | None = None, client=None) -> dict:
    """First sight of a model outside config.yaml (``UNPRICED_MODEL``): price it now and register
    it for the daily run; one registered already only has its estimated records re-priced."""
    now = now or utc_now()
    if model_id in price_store.registered_models():  # priced already: only records counted meanwhile
        return {"status": "registered", "written": 0, "kept": 0, "models": 0, "repriced": reprice_estimates([model_id])}
    name = bedrock.foundation_model_name(
        model_id, region if region and bedrock.is_known_region(region) else default_price_region()
    )
    if name is None:
        return {"status": "unresolved", "written": 0, "kept": 0, "models": 0}
    points = price_list.read_points({name}, client)
    if points is None:
        return {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    report = {"status": "ok", **_write(points, [PricedModelId(model_id, name, {})], now)}
    price_store.register_model(model_id, name)
    report["repriced"] = reprice_estimates([model_id])
    logger.info("unpriced model looked up", extra={"model_id": model_id, "price_list_model": name, **report})
    return report


REPRICE_ATTEMPTS = 5


def reprice(pending: dict, now: datetime) -> bool:
    """Correct one estimated record to its day's price, exactly once; False when unknown or done already."""
    tokens = Tokens(*(int(pending.get(name, 0)) for name in Tokens._fields))
    day = datetime.strptime(pending["org_day"], "%Y%m%d").date()
    model_id = pending["model_id"]
    known = quote(
        model_id,
        day,
        pending.get("region"),
        pending.get("profile_kind", IN_REGION),
        profiles.configured_for_model(model_id),
        Dimensions.from_item(pending),
        tokens,
        reserved_at_on_demand=True,  # a reserved-tier record is counted at the estimate only when so
    )
    if known.source == ESTIMATE:
        return False
    delta = cost_usd_micros(tokens, known.prices) - int(pending["cost_usd_micros"])
    now_epoch = int(now.timestamp())
    kept_until = get_config().metering.marker_expires_at(now_epoch)  # as any marker, from now on
    for attempt in range(REPRICE_ATTEMPTS):
        try:
            return usage_store.reprice_once(pending, delta, known.source, now_epoch, kept_until, attempt)
        except usage_store.Conflict:
            retry_pause(attempt)
    raise RuntimeError("re-pricing kept conflicting with concurrent usage writes")  # the next run retries


class RepricingFailed(Exception):
    """Re-pricing some models failed (each logged) after the others were done, so a retry finds only the rest."""


def reprice_estimates(model_ids: Iterable[str], now: datetime | None = None) -> int:
    """Re-price the estimated records of ``model_ids`` whose price is known now; how many were
    corrected. A failing model does not stop the others (``RepricingFailed`` after)."""
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
