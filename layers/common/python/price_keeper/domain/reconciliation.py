"""Reconciliation: Bedrock's own counts (CloudWatch ``AWS/Bedrock``) against the metered ones, per model and UTC day,
hourly, with ``UNREPORTED_USAGE`` where the unmetered spend is large. See docs/reconciliation.md.

Metered arrivals by hour come from the hour marks the aggregator keeps on each label total (``store.reconciliation``),
so they cost no write of their own. Metered usage counts when it arrives, Bedrock's when the call was made: for day D
the reconciler compares calls made in [D, min(D + 1 day, now - tolerance)) with arrivals in
[D, min(now, D + 1 day + tolerance)), so a report late within the tolerance never shows as unmetered.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import NamedTuple

from ..aws import cloudwatch, stack_region
from ..config import GEOGRAPHIC, GLOBAL, IN_REGION, get_config
from ..errors import ApiError, invalid_request
from ..store import keys
from ..store import reconciliation as store
from ..timeutil import iso_utc, utc_now
from . import alerts, orgs, pricing, profiles, reports
from .aggregation import usage_expires_at

_SYSTEM_PROFILE = re.compile(r"^(?P<geography>[a-z-]+)\.(?P<model>[a-z0-9-]+\..+)$")


class Counts(NamedTuple):
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0

    def __add__(self, other: Counts) -> Counts:  # type: ignore[override]
        return Counts(*(a + b for a, b in zip(self, other, strict=True)))

    def __sub__(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(self, other, strict=True)))

    def tokens(self) -> pricing.Tokens:
        return pricing.Tokens(
            self.input_tokens, self.output_tokens, self.cache_read_input_tokens, self.cache_write_input_tokens
        )


class Label(NamedTuple):
    """What a metered label bills: the model as CloudWatch names it, its price, and the (org, app)
    owning it when it is an application inference profile."""

    model_id: str
    priced: profiles.PricedModel | None
    owner: tuple[str, str | None] | None
    called: str = ""  # what its clients pass to Bedrock: the model id or profile ARN


def model_key(identifier: str) -> str:
    """The ``ModelId`` a call is counted under: an ARN's resource id, else what the caller named."""
    return identifier.rsplit("/", 1)[-1] if identifier.startswith("arn:") else identifier


def bedrock_counts(start: datetime, end: datetime) -> dict[str, Counts]:
    """Bedrock's counts of calls made in [start, end), by the model they are counted under."""
    counts: dict[str, Counts] = defaultdict(Counts)
    for model_id, sums in cloudwatch.bedrock_sums(start, end).items():
        counts[model_key(model_id)] += Counts(*sums)
    return dict(counts)


def _resolve(scope: str, label: str, cache: dict) -> Label | None:
    """The model a scope's label bills (None: no longer known). A config.yaml label is resolved
    once for every scope, without reading any org's config."""
    org_id, app_id = keys.split_scope(scope)
    if label in get_config().labels:
        if label not in cache:
            cache[label] = _label(get_config().labels[label].id, lambda: profiles.priced_config_label(label, None))
        resolved = cache[label]
    else:
        if (scope, label) not in cache:
            try:
                config = orgs.effective_config(org_id, app_id)
                called = profiles.bedrock_id(config, label)
            except ApiError:
                called = None
            cache[(scope, label)] = called and _label(called, lambda: profiles.priced_model(config, label, None))
        resolved = cache[(scope, label)]
    if resolved is None or ":application-inference-profile/" not in resolved.called:
        return resolved
    return resolved._replace(owner=(org_id, app_id))


def _label(called: str, price) -> Label:
    try:
        priced = price()
    except (ApiError, ValueError):
        priced = None  # Bedrock did not answer for the profile: priced as the model key alone
    return Label(model_key(called), priced, None, called)


def _marks(item: dict) -> list[tuple[str, Counts]]:
    return [(hour, Counts(*values)) for hour, values in store.marks_of(item)]


def arrived_between(item: dict, start: datetime, end: datetime | None) -> Counts:
    """What a label total gained from ``start`` to ``end`` (None: until now), from its hour marks
    (rounded outwards to whole hours)."""
    marks = _marks(item)
    first_hour = start.strftime("%Y%m%d%H")
    before = [counts for hour, counts in marks if hour < first_hour]
    if end is None:
        after = Counts(*(int(item.get(name, 0)) for name in store.MARK_FIELDS))
    else:
        last_hour = (end - timedelta(microseconds=1)).strftime("%Y%m%d%H")  # the hour [end) ends in
        through = [counts for hour, counts in marks if hour <= last_hour]
        after = through[-1] if through else Counts()
    return after - (before[-1] if before else Counts())


def metered_counts(day: date, start: datetime, end: datetime | None) -> tuple[dict[str, Counts], dict[str, Label]]:
    """Metered arrivals in [start, end) by model over the org days overlapping ``day``, and their labels."""
    org_days = [(day + timedelta(days=offset)).strftime("%Y%m%d") for offset in (-1, 0, 1, 2)]
    counts: dict[str, Counts] = defaultdict(Counts)
    labels: dict[str, Label] = {}
    owners: dict[str, set] = defaultdict(set)
    resolved: dict = {}
    for chunk in store.label_totals(org_days):
        for item in chunk:
            label = _resolve(*keys.split_usage_key(item["usage_key"]), resolved)
            if label is None:
                continue
            counts[label.model_id] += arrived_between(item, start, end)
            labels.setdefault(label.model_id, label)
            owners[label.model_id].add(label.owner)
    for model_id, found in owners.items():
        labels[model_id] = labels[model_id]._replace(owner=common_owner(found))
    return dict(counts), labels


def common_owner(owners: set) -> tuple[str, str | None] | None:
    """Whose alert a model's unmetered spend is, from its labels' (org, app) owners: its one
    owner's, else its one org's, else None (the operator's)."""
    if len(owners) == 1:
        return next(iter(owners))
    orgs_owning = {owner[0] if owner else None for owner in owners}
    return (orgs_owning.pop(), None) if len(orgs_owning) == 1 and None not in orgs_owning else None


def price_of_model(model_id: str, label: Label | None, day: date, region: str) -> pricing.PriceQuote:
    """A model's price: its metered label's, else from the id (a system profile's prefix: its kind)."""
    if label and label.priced:
        return pricing.price_of(label.priced, day)
    system = _SYSTEM_PROFILE.match(model_id)
    if system:
        model, kind = system["model"], GLOBAL if system["geography"] == "global" else GEOGRAPHIC
    else:
        model, kind = model_id, IN_REGION
    return pricing.quote(model, day, region, kind, profiles.configured_for_model(model))


def _side(counts: Counts) -> dict:
    return {"invocations": counts.requests, "input_tokens": counts.input_tokens, "output_tokens": counts.output_tokens}


def reconcile(day: date, now: datetime | None = None) -> dict:
    """Compare UTC ``day`` as of ``now``, store the result and fire its alerts; the result."""
    now = now or utc_now()
    settings = get_config().reconciliation
    tolerance = timedelta(seconds=settings.tolerance_seconds)
    start = datetime.combine(day, time(0), UTC)
    end = start + timedelta(days=1)
    bedrock_until = min(end, now - tolerance)
    bedrock = bedrock_counts(start, bedrock_until) if bedrock_until > start else {}
    metered_until = end + tolerance
    metered, labels = metered_counts(day, start, None if metered_until >= now else metered_until)
    region = stack_region()
    models = []
    for model_id in sorted(set(bedrock) | {key for key, counts in metered.items() if any(counts)}):
        ours, theirs = metered.get(model_id, Counts()), bedrock.get(model_id, Counts())
        unmetered = Counts(*(max(0, b - m) for b, m in zip(theirs, ours, strict=True)))
        quote = price_of_model(model_id, labels.get(model_id), day, region)
        unmetered_cost = pricing.cost_usd_micros(unmetered.tokens(), quote.prices) if any(unmetered[1:]) else 0
        models.append(
            {
                "model_id": model_id,
                "bedrock": _side(theirs),
                "metered": _side(ours),
                "unmetered": {
                    "input_tokens": unmetered.input_tokens,
                    "output_tokens": unmetered.output_tokens,
                    "estimated_cost_usd_micros": unmetered_cost,
                },
            }
        )
        if unmetered_cost:
            _alert(model_id, labels.get(model_id), day, region, unmetered_cost, theirs, quote, now)
    result = {
        "date": day.isoformat(),
        "region": region,
        "models": models,
        "reconciled_at": iso_utc(now),
        "bedrock_until": iso_utc(bedrock_until),
    }
    store.put_result(day.strftime("%Y%m%d"), result, usage_expires_at(day.strftime("%Y%m%d")))
    return result


def _alert(
    model_id: str,
    label: Label | None,
    day: date,
    region: str,
    unmetered_cost: int,
    bedrock: Counts,
    quote: pricing.PriceQuote,
    now: datetime,
) -> None:
    """``UNREPORTED_USAGE`` when the unmetered spend reaches the configured share or amount."""
    settings = get_config().reconciliation
    bedrock_cost = pricing.cost_usd_micros(bedrock.tokens(), quote.prices)
    share_reached = unmetered_cost * 100 >= settings.alert_share_pct * bedrock_cost
    if not (share_reached or unmetered_cost >= settings.alert_amount_usd_micros):
        return
    config = None
    if label and label.owner:
        try:
            config = orgs.effective_config(*label.owner)
        except ApiError:
            config = None
    # spend_usd_micros: the unmetered estimate; quota_usd_micros: Bedrock's whole count
    alert = alerts.Alert(
        alerts.UNREPORTED_USAGE, None, None, unmetered_cost, bedrock_cost, model_id=model_id, region=region
    )
    alerts.fire_once(config, day.strftime("%Y%m%d"), alert, now)


def run(now: datetime | None = None) -> list[dict]:
    """The scheduled run: today (UTC), and yesterday until its late reports are in."""
    now = now or utc_now()
    today = now.date()
    days = [today]
    settle = timedelta(seconds=get_config().reconciliation.tolerance_seconds) + timedelta(hours=2)
    if now - datetime.combine(today, time(0), UTC) < settle:
        days.insert(0, today - timedelta(days=1))
    return [reconcile(day, now) for day in days]


def stored(date_text: str | None, page: int = 0) -> dict:
    """``GET /api/v1/reconciliation``: one page of a UTC day's kept result (default today)."""
    day = reports.parse_date(date_text, "date") if date_text is not None else utc_now().date()
    found = store.get_result(day.strftime("%Y%m%d"), page)
    pages = int(found["pages"]) if found else 0
    if page > 0 and page >= pages:
        raise invalid_request("No such page of that day's reconciliation", page=page, pages=pages)
    if not found:
        return {
            "date": day.isoformat(),
            "region": stack_region(),
            "models": [],
            "page": 0,
            "pages": 0,
        }
    return {
        "date": found["date"],
        "region": found["region"],
        "models": [
            {
                "model_id": row["model_id"],
                **{
                    side: {name: int(value) for name, value in row[side].items()}
                    for side in ("bedrock", "metered", "unmetered")
                },
            }
            for row in found["models"]
        ],
        "page": page,
        "pages": pages,
    }
