"""Reading org and app configuration, and the inheritance rules between them.

An app inherits every setting from its org unless it overrides it; ``quota_scope``, ``timezone``, ``agg_shard_count``
and the alert thresholds always come from the org, and so do the quotas while the org is ORG-scoped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ..cache import TTLCache
from ..config import get_config
from ..errors import invalid_request, not_found
from ..store import boosts as boost_store
from ..store import config_items, daily_totals, keys
from ..store.dynamo import ReadAlong
from ..validation import APP_ID_PATTERN, is_app_id, is_uuid

CONFIG_CACHE_SECONDS = 30
_effective = TTLCache(CONFIG_CACHE_SECONDS)
_config_labels = TTLCache(60)  # the labels ``record_config_labels`` stored (they only grow)

APP_OVERRIDABLE = (
    "model_ordering",
    "quotas",
    "total_quota_usd_micros",
    "app_daily_cap_usd_micros",
    "tight_mode_threshold_pct",
    "refresh_interval_normal_secs",
    "refresh_interval_tight_secs",
)
# What an app may override only while its org is APP-scoped (its own quota counters).
APP_QUOTA_SETTINGS = ("quotas", "total_quota_usd_micros")


class EffectiveConfig(NamedTuple):
    org_id: str
    app_id: str | None
    org_name: str
    app_name: str | None
    timezone: str
    quota_scope: str
    model_ordering: tuple[str, ...]
    quotas: dict
    sticky_fallback_enabled: bool
    agg_shard_count: int  # the org's usage marker buckets (``keys.marker_key``): fixed at creation
    tight_mode_threshold_pct: int
    refresh_interval_normal_secs: int
    refresh_interval_tight_secs: int
    total_quota_usd_micros: int | None = None  # None: the sum of the ordering's label quotas
    alert_thresholds_pct: tuple[int, ...] = ()  # THRESHOLD alert percentages
    rate_limits: dict[str, int] = {}  # requests per window of the org's clients, by limit (overrides)
    app_daily_cap_usd_micros: int | None = None  # ORG scope: the most one app may spend a day; None: no cap
    boosts: dict[str, tuple[str, int, int]] = {}  # id -> (label, micro-USD, expiry epoch), expired included

    @property
    def total_quota(self) -> int:
        """The scope's daily cap over every label (boosted quotas raise the default)."""
        if self.total_quota_usd_micros is not None:
            return self.total_quota_usd_micros
        return sum(self.quota(label) for label in self.model_ordering)

    @property
    def app_counter(self) -> str | None:
        """ORG scope: the scope key of the app's own counters (held to its daily cap); else None."""
        if self.quota_scope != "ORG" or self.app_id is None:
            return None
        return keys.scope_key(self.org_id, self.app_id, "APP")

    @property
    def counted_scopes(self) -> tuple[str, ...]:
        """The scopes a record counts in: the quota scope and, with an app cap, the app's own counters."""
        if self.app_counter is None or self.app_daily_cap_usd_micros is None:
            return (self.scope,)
        return (self.scope, self.app_counter)

    @property
    def scope(self) -> str:
        """Scope key of quotas and counters: ``ORG#{org}`` or ``ORG#{org}#APP#{app}``."""
        return keys.scope_key(self.org_id, self.app_id, self.quota_scope)

    def quota(self, label: str) -> int:
        return int(self.quotas.get(label, 0))


def check_ids(org_id: str, app_id: str | None = None) -> None:
    """400 for path ids that cannot be keys (before anything touches the store)."""
    if not is_uuid(org_id):
        raise invalid_request("org_id must be a UUID", org_id=org_id[:100])
    if app_id is not None and not is_app_id(app_id):
        raise invalid_request(f"app_id must match {APP_ID_PATTERN}", app_id=app_id[:100])


def merge(org: dict, app: dict | None, org_id: str, app_id: str | None) -> EffectiveConfig:
    defaults = get_config().metering
    overridable = [k for k in APP_OVERRIDABLE if org["quota_scope"] == "APP" or k not in APP_QUOTA_SETTINGS]
    source = {**org, **{k: app[k] for k in overridable if app and k in app}}

    def number(name: str, default: int | None = None) -> int | None:
        value = source.get(name, default)
        return None if value is None else int(value)

    return EffectiveConfig(
        org_id=org_id,
        app_id=app_id,
        org_name=org.get("org_name", ""),
        app_name=app.get("app_name") if app else None,
        timezone=org["timezone"],
        quota_scope=org["quota_scope"],
        model_ordering=tuple(source["model_ordering"]),
        quotas={label: int(value) for label, value in source["quotas"].items()},
        sticky_fallback_enabled=bool(org.get("sticky_fallback_enabled", defaults.sticky_fallback_enabled)),
        agg_shard_count=int(org.get("agg_shard_count", defaults.usage_agg_shard_count)),
        tight_mode_threshold_pct=number("tight_mode_threshold_pct", defaults.tight_mode_threshold_pct),
        refresh_interval_normal_secs=number("refresh_interval_normal_secs", defaults.refresh_interval_normal_secs),
        refresh_interval_tight_secs=number("refresh_interval_tight_secs", defaults.refresh_interval_tight_secs),
        total_quota_usd_micros=number("total_quota_usd_micros"),
        app_daily_cap_usd_micros=number("app_daily_cap_usd_micros"),
        alert_thresholds_pct=(
            tuple(sorted({int(pct) for pct in org["alert_thresholds_pct"]}))
            if org.get("alert_thresholds_pct")
            else get_config().alerts.thresholds_pct
        ),
        rate_limits={name: int(requests) for name, requests in (org.get("rate_limits") or {}).items()},
        boosts=_boosts(org, app, app_id),
    )


def _boosts(org: dict, app: dict | None, app_id: str | None) -> dict[str, tuple[str, int, int]]:
    """The boosts kept on the quota scope's item: the org's in ORG scope, the app's in APP scope."""
    if org["quota_scope"] == "ORG":
        return boost_store.entries_of(org)
    return boost_store.entries_of(app) if app_id and app is not None else {}


def config_labels_ever() -> tuple[str, ...]:
    """config.yaml's labels, then every other label it had when the aggregator folded with it: a
    removed label's spend is still only in its own label total, so readers must still add it."""
    labels = tuple(get_config().labels)
    return labels + tuple(sorted(_stored_config_labels() - set(labels)))


def record_config_labels() -> None:
    """Store config.yaml's labels unless they are there: the aggregator does it before it folds,
    so a label is stored before any of its spend is kept apart from a scope total."""
    stored = _stored_config_labels()
    if missing := set(get_config().labels) - stored:
        daily_totals.record_config_labels(missing)
        _config_labels.put("stored", frozenset(stored | missing))


def _stored_config_labels() -> frozenset[str]:
    return _config_labels.get_or_load("stored", lambda: frozenset(daily_totals.config_labels_ever()))


def effective_config(org_id: str, app_id: str | None = None) -> EffectiveConfig:
    """Effective settings for an org (``app_id=None``) or an app; 404 when not registered."""
    cached = _effective.get((org_id, app_id))
    if cached is not None:
        return cached
    items = _client_items({(org_id, None), (org_id, app_id)})
    config = _cached(items, org_id, app_id)
    if config is None:
        org, _ = _org_and_app(items, org_id, app_id)
        if org is None:
            raise not_found("Organization not registered", org_id=org_id)
        raise not_found("Application not registered", org_id=org_id, app_id=app_id)
    return config


def effective_configs(pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], EffectiveConfig]:
    """``effective_config`` of many (org, app) pairs, read together; unregistered left out."""
    pairs = set(pairs)
    configs = {pair: _effective.get(pair) for pair in pairs}
    missing = [pair for pair, config in configs.items() if config is None]
    if missing:
        items = _client_items({*missing, *((org_id, None) for org_id, _ in missing)})
        configs |= {pair: _cached(items, *pair) for pair in missing}
    return {pair: config for pair, config in configs.items() if config is not None}


def config_along(org_id: str, app_id: str | None) -> ReadAlong | None:
    """The read of an uncached org's or app's config items, for a BatchGetItem made anyway (the token check): saves a
    round trip on most cold requests. What it finds is cached; what it does not is left to ``effective_config``."""
    if _effective.get((org_id, app_id)) is not None:
        return None
    pairs = {(org_id, None), (org_id, app_id)}

    def found(items: list[dict]) -> None:
        by_pair = config_items.clients_found(pairs, items)
        for pair in pairs:
            _cached(by_pair, *pair)

    return ReadAlong(config_items.clients_read(pairs, consistent=False), found)


def _cached(items: dict[tuple[str, str | None], dict], org_id: str, app_id: str | None) -> EffectiveConfig | None:
    """The effective config of (org, app) from the items read, cached; None when either is missing."""
    org, app = _org_and_app(items, org_id, app_id)
    if org is None or (app_id and app is None):
        return None
    config = merge(org, app, org_id, app_id)
    _effective.put((org_id, app_id), config)
    return config


def _client_items(pairs: set[tuple[str, str | None]]) -> dict[tuple[str, str | None], dict]:
    """The config items of ``pairs``; those not found read again strongly (created a moment ago)."""
    items = config_items.clients(pairs, consistent=False)
    if missing := pairs - items.keys():
        items |= config_items.clients(missing)
    return items


def _org_and_app(items: dict, org_id: str, app_id: str | None) -> tuple[dict | None, dict | None]:
    return items.get((org_id, None)), items.get((org_id, app_id)) if app_id else None


def forget(org_id: str, app_id: str | None = None) -> None:
    """Drop cached config after a change made by this process."""
    _effective.discard((org_id, app_id))
    if app_id is None:
        _effective.clear()  # every app of the org inherits from it
