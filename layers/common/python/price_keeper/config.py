"""Service configuration loaded once per process.

People edit ``config.yaml``; the CDK bundling ships it in the layer as ``config.json``
(parsed and checked at synth), so a Lambda cold start reads it with the standard library
instead of importing and running a YAML parser. Lookup order: ``PRICE_KEEPER_CONFIG`` (a
``.yaml`` or ``.json`` path), the bundled ``config.json`` in this package, then the
repository's ``config.yaml`` (local stack and tests).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from . import state

BUNDLED_NAME = "config.json"
_PACKAGE_DIR = Path(__file__).resolve().parent
# The repository root is three levels up in a checkout; in Lambda (/opt/python/price_keeper) there is none.
_CANDIDATES = (_PACKAGE_DIR / BUNDLED_NAME, *(root / "config.yaml" for root in _PACKAGE_DIR.parents[3:4]))

LABEL_TYPES = ("model", "profile")
# How a call reaches its model, which selects the price (the wire names of ``pricing.profile_kind``):
# a foundation model or an in-region profile, a geographic cross-region profile (``us.``,
# ``eu.``...), or a global one (``global.``, billed at its own, lower, rate).
IN_REGION, GEOGRAPHIC, GLOBAL = "IN_REGION", "GEOGRAPHIC", "GLOBAL"
# config.yaml keys of a label's cross-region prices
CROSS_REGION_KEYS = {"geographic": GEOGRAPHIC, "global": GLOBAL}
PRICE_FIELDS = {
    "input": "input_price_usd_micros_per_1m",
    "output": "output_price_usd_micros_per_1m",
    "cache_read": "cache_read_price_usd_micros_per_1m",
    "cache_write": "cache_write_price_usd_micros_per_1m",
    # cache writes made with the 1-hour TTL (0: not known); the other writes are at cache_write
    "cache_write_1h": "cache_write_1h_price_usd_micros_per_1m",
}

# The offers Bedrock bills the same tokens at (docs/metering.md, "What a call costs"): the
# standard on-demand one, the service tiers, batch, latency-optimized inference, and a
# long-context rate of each (a request whose prompt is over the model's threshold).
STANDARD = "standard"
PRIORITY, FLEX, BATCH, LATENCY_OPTIMIZED = "priority", "flex", "batch", "latency_optimized"
LONG_CONTEXT = "long_context"
OFFERS = (
    STANDARD,
    PRIORITY,
    FLEX,
    BATCH,
    LATENCY_OPTIMIZED,
    LONG_CONTEXT,
    *(f"{offer}_{LONG_CONTEXT}" for offer in (PRIORITY, FLEX, BATCH)),
)
DEFAULT_LONG_CONTEXT_THRESHOLD = 200_000  # input tokens (Anthropic's, for the 1M-context models)
MAX_OFFER_PCT = 1000


def long_offer(offer: str) -> str:
    """The long-context variant of an offer (a request whose prompt is over the model's threshold)."""
    return LONG_CONTEXT if offer == STANDARD else f"{offer}_{LONG_CONTEXT}"


def offer_key(kind: str, offer: str) -> str:
    """The key of a kind's offer among a label's configured prices (``Label.configured_prices``):
    the kind itself for the standard offer (``IN_REGION``), else ``IN_REGION/priority``."""
    return kind if offer == STANDARD else f"{kind}/{offer}"


TOKENS_PER_PRICE = 1_000_000  # prices are per 1M tokens


class Prices(NamedTuple):
    """Integer micro-USD per ``TOKENS_PER_PRICE`` tokens."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0


def scaled(prices: Prices, numerator: int, denominator: int) -> Prices:
    """Each component times numerator / denominator, rounded up (never under-counts)."""
    return Prices(*(-(-value * numerator // denominator) for value in prices))


def completed(card: dict[str, int], standard: Prices) -> Prices:
    """An offer's prices with the components it leaves out derived from the standard ones at the
    offer's input ratio (a priority tier at 175 % of the input price: its cache prices too)."""
    ratio_of = scaled(standard, card["input"], standard.input) if standard.input else standard
    return Prices(*(card[c] if c in card else getattr(ratio_of, c) for c in PRICE_FIELDS))


class Label(NamedTuple):
    name: str
    type: str
    id: str
    prices: Prices
    description: str = ""
    tier: str = ""
    family: str = ""
    # Prices of cross-region profiles (GEOGRAPHIC / GLOBAL) when the Price List has none;
    # a kind left out is priced as in-region.
    cross_region_prices: dict[str, Prices] = {}
    # The model's name in the AWS Price List (product attribute ``model``, e.g. "Nova Pro");
    # empty: the pricing fetcher does not look this label's model up.
    price_list_model: str = ""
    # Most tokens one usage record may report per field (``None``: the metering default).
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    # In-region prices of the other offers (``OFFERS``), explicit or a percentage of ``prices``.
    offer_prices: dict[str, Prices] = {}
    # Input tokens (input + cache reads + cache writes) above which a request is billed at the
    # long-context rate; None: the default threshold, where a long-context price is known.
    long_context_threshold_tokens: int | None = None

    def configured_prices(self) -> dict[str, Prices]:
        """The label's config.yaml prices by profile kind (IN_REGION always present), and by
        ``offer_key`` for the other offers."""
        return {
            IN_REGION: self.prices,
            **self.cross_region_prices,
            **{offer_key(IN_REGION, offer): prices for offer, prices in self.offer_prices.items()},
        }


class Metering(NamedTuple):
    usage_agg_shard_count: int = 8
    tight_mode_threshold_pct: int = 95
    refresh_interval_normal_secs: int = 300
    refresh_interval_tight_secs: int = 60
    sticky_fallback_enabled: bool = True
    dedup_ttl_days: int = 3
    usage_retention_days: int = 400
    # Seconds from a usage write to its DailyTotal: the stream's batching window (1 s) and
    # the fold (the usage reply's ``expected_aggregation_lag_secs``).
    aggregation_lag_secs: int = 2
    # A record stamped on the previous org-local day keeps that day only if it arrives
    # this long after local midnight; later, it counts toward the day it arrives on.
    backdate_grace_secs: int = 900
    # Default per-record token caps of a label (config.yaml may set them per label):
    # input covers the cache read/write counts too, which are input tokens.
    max_input_tokens: int = 1_000_000
    max_output_tokens: int = 128_000
    # In ORG scope, what one app's live reservations may hold of the scope's headroom (its
    # total cap less the spend counted without a reservation), so that one app cannot hold
    # what its siblings need (docs/metering.md, "Reservations").
    app_hold_share_pct: int = 50

    def marker_expires_at(self, now_epoch: int) -> int:
        """When a dedup marker written (or re-priced) at ``now_epoch`` expires."""
        return now_epoch + self.dedup_ttl_days * 86400


class Alerts(NamedTuple):
    """Spend alert settings: THRESHOLD alerts fire at these percentages of a label's daily quota."""

    thresholds_pct: tuple[int, ...] = (80, 95)


def _alerts(raw: dict) -> Alerts:
    thresholds = tuple(raw.get("thresholds_pct", Alerts._field_defaults["thresholds_pct"]))
    if any(not isinstance(pct, int) or isinstance(pct, bool) or not 1 <= pct <= 100 for pct in thresholds):
        raise ValueError("alerts.thresholds_pct must be integers from 1 to 100")
    return Alerts(thresholds_pct=tuple(sorted(set(thresholds))))


class Reconciliation(NamedTuple):
    """Bedrock's own counts against the metered ones (``domain.reconciliation``)."""

    # How late a report may reach DailyTotal after its call (client flush + aggregation) and
    # still be matched: Bedrock's counts of the last ``tolerance_seconds`` wait for the next run.
    tolerance_seconds: int = 900
    # UNREPORTED_USAGE fires for a model when its unmetered spend reaches this share of
    # Bedrock's count (estimated cost) or this amount, whichever comes first.
    alert_share_pct: int = 5
    alert_amount_usd_micros: int = 1_000_000
    # The cost-allocation tag whose value names an application inference profile's id: the
    # daily bill comparison (domain.bill) runs only when it is set.
    bill_tag_key: str = ""


def _reconciliation(raw: dict) -> Reconciliation:
    settings = Reconciliation(**raw)
    numbers = settings[:-1]
    if any(not isinstance(value, int) or isinstance(value, bool) or value < 0 for value in numbers):
        raise ValueError("reconciliation settings must be integers >= 0")
    if not isinstance(settings.bill_tag_key, str):
        raise ValueError("reconciliation.bill_tag_key must be a string")
    return settings


class ReservedTier(NamedTuple):
    """Calls on the ``reserved`` service tier are prepaid capacity: their tokens are counted
    at no marginal cost, unless an org counts them at on-demand rates (so its quotas bound
    them as any call)."""

    count_at_on_demand: bool = False  # every org
    orgs_at_on_demand: frozenset[str] = frozenset()  # these orgs

    def at_on_demand(self, org_id: str) -> bool:
        return self.count_at_on_demand or org_id in self.orgs_at_on_demand


def _reserved_tier(raw: dict) -> ReservedTier:
    unknown = sorted(set(raw) - set(ReservedTier._fields))
    if unknown:
        raise ValueError(f"reserved_tier: unknown settings {unknown}")
    at_on_demand = raw.get("count_at_on_demand", False)
    orgs = raw.get("orgs_at_on_demand") or []
    if not isinstance(at_on_demand, bool) or not all(isinstance(org, str) for org in orgs):
        raise ValueError("reserved_tier: count_at_on_demand must be a boolean, orgs_at_on_demand a list of org ids")
    return ReservedTier(at_on_demand, frozenset(orgs))


class RateLimit(NamedTuple):
    name: str
    requests: int
    per_seconds: int


@dataclass(frozen=True)
class ServiceConfig:
    service_name: str
    version: str
    metering: Metering
    labels: dict[str, Label]
    org_defaults: dict = field(default_factory=dict)
    rate_limits: dict[str, RateLimit] = field(default_factory=dict)
    alerts: Alerts = field(default_factory=Alerts)
    reconciliation: Reconciliation = field(default_factory=Reconciliation)
    # The floor of the price of a model with no known price (a profile routing outside
    # config.yaml and the Price List; ``pricing.estimate`` raises it to every Price List price
    # read): each component the higher of config.yaml ``unknown_model_estimate`` and every
    # label's price.
    unknown_model_estimate: Prices = Prices(0, 0)
    # The estimate of each other offer: the highest of its floor (``unknown_model_estimate.offers``)
    # and every label's price of that offer (``pricing.estimate``).
    unknown_model_offer_estimates: dict[str, Prices] = field(default_factory=dict)
    reserved_tier: ReservedTier = field(default_factory=ReservedTier)

    def token_caps(self, label: str) -> tuple[int, int]:
        """(max input, max output) tokens one usage record of ``label`` may report."""
        spec = self.labels.get(label)
        return (
            (spec and spec.max_input_tokens) or self.metering.max_input_tokens,
            (spec and spec.max_output_tokens) or self.metering.max_output_tokens,
        )


def config_path() -> Path:
    explicit = os.environ.get("PRICE_KEEPER_CONFIG")
    if explicit:
        return Path(explicit)
    for candidate in _CANDIDATES:
        if candidate.exists():
            return candidate
    raise FileNotFoundError("config.yaml not found; set PRICE_KEEPER_CONFIG")


def read_raw(path: Path) -> dict:
    """The settings in a ``.json`` or YAML file, as plain data."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    import yaml  # only where config.yaml itself is read: the local stack, tests and synth

    # libyaml's loader when PyYAML was built with it: about ten times faster than the pure one
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _positive_or_none(spec: dict, name: str, label: str) -> int | None:
    value = spec.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"label {label}: {name} must be a positive integer")
    return value


def _prices(spec: dict, where: str) -> Prices:
    """Prices from the ``*_price_usd_micros_per_1m`` fields (input and output required)."""
    values = {}
    for component, name in PRICE_FIELDS.items():
        value = spec.get(name, None if component in ("input", "output") else 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}: {name} must be an integer >= 0")
        values[component] = value
    return Prices(**values)


def _offer_prices(spec: dict, standard: Prices, where: str) -> dict[str, Prices]:
    """``offers: {priority: {pct: 175}, long_context: {input_price_usd_micros_per_1m: ..., ...}}``:
    each offer's in-region prices, explicit (input and output required, the cache prices
    left out derived at the input ratio: ``completed``) or a percentage of every standard one."""
    raw = spec.get("offers") or {}
    unknown = sorted(set(raw) - set(OFFERS[1:]))
    if unknown:
        raise ValueError(f"{where}: offers keys must be among {list(OFFERS[1:])}")
    offers = {}
    for offer, card in raw.items():
        if not isinstance(card, dict):
            raise ValueError(f"{where} offers.{offer}: prices or pct")
        if "pct" in card:
            pct = card["pct"]
            if len(card) > 1 or not isinstance(pct, int) or isinstance(pct, bool) or not 1 <= pct <= MAX_OFFER_PCT:
                raise ValueError(f"{where} offers.{offer}: pct must be an integer from 1 to {MAX_OFFER_PCT}, alone")
            offers[offer] = scaled(standard, pct, 100)
        else:
            explicit = _prices(card, f"{where} offers.{offer}")
            given = {c: getattr(explicit, c) for c, name in PRICE_FIELDS.items() if name in card}
            offers[offer] = completed(given, standard)
    return offers


def _cross_region_prices(spec: dict, label: str) -> dict[str, Prices]:
    raw = spec.get("cross_region_prices") or {}
    unknown = sorted(set(raw) - set(CROSS_REGION_KEYS))
    if unknown:
        raise ValueError(f"label {label}: cross_region_prices keys must be among {sorted(CROSS_REGION_KEYS)}")
    return {
        CROSS_REGION_KEYS[key]: _prices(prices, f"label {label} cross_region_prices.{key}")
        for key, prices in raw.items()
    }


def _highest(prices: list[Prices]) -> Prices:
    """Each component's highest price (a conservative estimate for a model of unknown price)."""
    return Prices(*(max((getattr(p, c) for p in prices), default=0) for c in PRICE_FIELDS))


def parse_config(raw: dict) -> ServiceConfig:
    labels = {}
    for name, spec in (raw.get("model_labels") or {}).items():
        if spec.get("type") not in LABEL_TYPES:
            raise ValueError(f"label {name}: type must be one of {LABEL_TYPES}")
        labels[name] = Label(
            name=name,
            type=spec["type"],
            id=spec["id"],
            prices=_prices(spec, f"label {name}"),
            description=spec.get("description", ""),
            tier=spec.get("tier", ""),
            family=spec.get("family", ""),
            cross_region_prices=_cross_region_prices(spec, name),
            price_list_model=spec.get("price_list_model", ""),
            max_input_tokens=_positive_or_none(spec, "max_input_tokens", name),
            max_output_tokens=_positive_or_none(spec, "max_output_tokens", name),
            long_context_threshold_tokens=_positive_or_none(spec, "long_context_threshold_tokens", name),
        )
        labels[name] = labels[name]._replace(offer_prices=_offer_prices(spec, labels[name].prices, f"label {name}"))
    service = raw.get("service") or {}
    floor = raw.get("unknown_model_estimate") or {}
    floor_prices = [_prices(floor, "unknown_model_estimate")] if floor else []
    floor_offers = _offer_prices(floor, floor_prices[0], "unknown_model_estimate") if floor else {}
    return ServiceConfig(
        service_name=service.get("name", "bedrock-price-keeper"),
        version=str(service.get("version", "1.0.0")),
        metering=Metering(**(raw.get("metering") or {})),
        labels=labels,
        org_defaults=raw.get("org_defaults") or {},
        rate_limits={
            name: RateLimit(name, int(spec["requests"]), int(spec["per_seconds"]))
            for name, spec in (raw.get("rate_limits") or {}).items()
        },
        alerts=_alerts(raw.get("alerts") or {}),
        reconciliation=_reconciliation(raw.get("reconciliation") or {}),
        unknown_model_estimate=_highest([label.prices for label in labels.values()] + floor_prices),
        unknown_model_offer_estimates={
            offer: _highest(
                [label.offer_prices[offer] for label in labels.values() if offer in label.offer_prices]
                + ([floor_offers[offer]] if offer in floor_offers else [])
            )
            for offer in OFFERS[1:]
        },
        reserved_tier=_reserved_tier(raw.get("reserved_tier") or {}),
    )


@lru_cache(maxsize=1)
def get_config() -> ServiceConfig:
    return parse_config(read_raw(config_path()))


state.kept(get_config.cache_clear)
