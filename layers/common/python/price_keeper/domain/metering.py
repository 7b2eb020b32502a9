"""Usage metering: validate a usage record, price it, and count it exactly once.

A record is its dedup marker (``store.usage``): one conditional write, folded by the aggregator from the usage stream
(``domain.ledger``). A retry of the request id, across midnight or a scope change too (the dedup key names only the
app and request id), cancels on the marker and is answered with what the first acceptance counted.

A record counts toward the org-local day it *arrives* on, so back-dating cannot spend around today's quota; only one
stamped within ``backdate_grace_secs`` before midnight and arriving as soon after keeps its day, while that day has
room for it (``_room_on_closed_day``). See docs/metering.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from .. import ratelimit, routes
from ..bodies import UsageRequest
from ..cache import TTLCache
from ..config import IN_REGION, get_config
from ..errors import ApiError, as_api_error, invalid_request, service_unavailable
from ..observability import logger
from ..store import daily_totals, keys, usage
from ..timeutil import day_start_utc, iso_utc, org_date, org_day, parse_day, retry_pause, utc_now
from ..validation import is_label
from . import alerts, boosts, pricing, profiles, reservations, selection
from .aggregation import Totals, scope_totals, scope_usage_keys, usage_expires_at
from .orgs import EffectiveConfig
from .quota import EXCEEDED, NORMAL, TIGHT, quota_pct, quota_status

CLOCK_SKEW_SECS = 300  # a timestamp up to 5 min ahead of the server clock is not "in the future"
TRANSACTION_ATTEMPTS = 5
MARKER_THREADS = 10  # a batch's ledger markers written at once (the store client's connections)
# The single report's rate limit, which a batch record written on its own is charged to.
USAGE_LIMIT = next(route.rate_limit for route in routes.ROUTES if route.path == routes.USAGE)

_TIMESTAMP_SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
# A record's token counts, in ``pricing.Tokens``' order.
TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "cache_write_1h_input_tokens",
)


class Submission(NamedTuple):
    """A validated, priced usage record, ready to be written."""

    request_id: str
    dedup_key: str  # the record's identity (``keys.dedup_key``)
    marker_key: dict  # its marker's key (``keys.marker_key``)
    scopes: tuple[str, ...]  # the quota scope's counters, and in ORG scope the app's own
    label: str
    day: str  # org-local yyyymmdd the record counts toward (see ``booking_day``)
    shard_id: int  # the reply's ``processing.shard_id``: its marker's bucket among the org's ``agg_shard_count``
    tokens: pricing.Tokens
    cost_usd_micros: int
    quote: pricing.PriceQuote
    live: bool = False  # a record of a tight label-day: its cost on a live item too
    lists_day: bool = False  # a label-day not folded yet: its index entry too (``usage.day_listed``)

    @property
    def scope(self) -> str:
        return self.scopes[0]


class Outcome(NamedTuple):
    request_id: str
    label: str
    day: str
    shard_id: int
    cost_usd_micros: int
    price_source: str
    profile_kind: str
    duplicate: bool
    applied: dict  # how it was priced (``pricing.PriceQuote.applied``; a duplicate's: no rates)


def parse_timestamp(text: str) -> datetime:
    """ISO 8601 date and time (``Z``, an offset, or none meaning UTC) as a UTC datetime."""
    try:
        if not _TIMESTAMP_SHAPE.match(text):
            raise ValueError(text)
        moment = datetime.fromisoformat(text)
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    except ValueError:
        raise invalid_request("timestamp must be ISO 8601, e.g. 2026-01-23T15:30:45Z", timestamp=text[:40]) from None
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise invalid_request("Timestamp outside acceptable range", timestamp=text[:40]) from None


def booking_day(moment: datetime, tz_name: str, now: datetime) -> str:
    """The org day a record stamped ``moment`` counts toward, if acceptable ``now`` (from the start
    of the previous local day to ``now`` plus the clock skew): today, but for the midnight grace."""
    if moment > now + timedelta(seconds=CLOCK_SKEW_SECS):
        raise invalid_request(
            "Timestamp is in the future",
            timestamp=iso_utc(moment),
            server_time=iso_utc(now),
            allowed_clock_skew_secs=CLOCK_SKEW_SECS,
        )
    today = org_date(tz_name, now)
    today_start = day_start_utc(tz_name, today)
    earliest = day_start_utc(tz_name, today - timedelta(days=1))
    if moment < earliest:
        latest = day_start_utc(tz_name, today + timedelta(days=1)) - timedelta(seconds=1)
        raise invalid_request(
            "Timestamp outside acceptable range",
            timestamp=iso_utc(moment),
            org_day=today.strftime("%Y%m%d"),
            timezone=tz_name,
            acceptable_range=f"{iso_utc(earliest)} to {iso_utc(latest)}",
        )
    grace = timedelta(seconds=get_config().metering.backdate_grace_secs)
    if today_start - grace <= moment < today_start and now < today_start + grace:
        return org_day(tz_name, moment)
    return today.strftime("%Y%m%d")


def check_token_caps(request: UsageRequest) -> None:
    """400 for a token count over the label's per-record cap (one record cannot spend a day)."""
    max_input, max_output = get_config().token_caps(request.model_label)
    for name in TOKEN_FIELDS:
        cap = max_output if name == "output_tokens" else max_input  # cache counts share the input cap
        if getattr(request, name) > cap:
            raise invalid_request(
                f"{name} exceeds the per-record limit for {request.model_label}",
                field=name,
                limit=cap,
                value=getattr(request, name),
                model_label=request.model_label,
            )


def priced_label(config: EffectiveConfig, label: str, calling_region: str | None) -> profiles.PricedModel:
    """Check the usage label and resolve what it bills. Any label the service can price is
    accepted, in the app's ordering or not: the call was made and billed, so it is counted."""
    known = profiles.known_label(config, label) if is_label(label) else None
    if known is None:
        raise ApiError(
            400,
            "INVALID_MODEL_LABEL",
            "Model label not defined in config",
            {"model_label": label[:64], "valid_labels": sorted(get_config().labels)},
        )
    is_profile = known != "config" or get_config().labels[label].type == "profile"
    if is_profile and not calling_region:
        raise invalid_request(
            f"calling_region is required when using inference profile label: {label}",
            model_label=label,
            label_type="profile",
        )
    return profiles.priced_model(config, label, calling_region)


def prepare(config: EffectiveConfig, request: UsageRequest, now: datetime) -> Submission:
    """Validate and price one record (no writes but a grace booking's claim: ``_room_on_closed_day``)."""
    day = booking_day(parse_timestamp(request.timestamp), config.timezone, now)
    check_token_caps(request)
    priced = priced_label(config, request.model_label, request.calling_region)
    profiles.check_reported_model(priced, request.bedrock_model_id)
    submission = _priced_on(config, request, priced, day)
    today = org_day(config.timezone, now)
    if day != today and not _room_on_closed_day(config, submission):
        submission = _priced_on(config, request, priced, today)
    return submission


def _priced_on(config: EffectiveConfig, request: UsageRequest, priced: profiles.PricedModel, day: str) -> Submission:
    tokens = pricing.Tokens(*(getattr(request, name) for name in TOKEN_FIELDS))
    quote = pricing.price_of(priced, parse_day(day), pricing.Dimensions.of(request), tokens, config.org_id)
    return Submission(
        request_id=request.request_id,
        dedup_key=keys.dedup_key(config.org_id, config.app_id, request.request_id),
        marker_key=keys.marker_key(config.org_id, config.app_id, request.request_id, config.agg_shard_count),
        scopes=config.counted_scopes,
        label=request.model_label,
        day=day,
        shard_id=keys.marker_bucket(config.app_id, request.request_id, config.agg_shard_count),
        tokens=tokens,
        cost_usd_micros=pricing.cost_usd_micros(tokens, quote.prices),
        quote=quote,
    )


def _room_on_closed_day(config: EffectiveConfig, submission: Submission) -> bool:
    """Whether the closed day a grace booking counts toward still has room for it under the label's quota and the
    scope's cap, taking the room if so (``daily_totals.claim_grace``), so the grace cannot make a closed day a place
    for unbounded spend; a record that does not fit counts today."""
    day, scope = submission.day, config.scope
    label_key = keys.usage_key(scope, submission.label)
    found = daily_totals.read_days([(label_key, day), *((usage_key, day) for usage_key in scope_usage_keys(scope))])
    left = {}
    if quota := config.quota(submission.label):
        left[label_key] = quota - Totals.from_item(found.get((label_key, day))).cost_usd_micros
    spent = scope_totals(scope, lambda usage_key: Totals.from_item(found.get((usage_key, day))))
    left[keys.scope_total_key(scope)] = config.total_quota - spent.cost_usd_micros
    return daily_totals.claim_grace(left, day, submission.cost_usd_micros, usage_expires_at(day))


def _estimated(submission: Submission) -> dict | None:
    """What re-pricing needs of a record counted at the estimate; None when priced or of no tokens."""
    quote = submission.quote
    if quote.source != pricing.ESTIMATE or not any(submission.tokens):
        return None
    return {
        "model_id": quote.model_id,
        "profile_kind": quote.profile_kind,
        **({"region": quote.region} if quote.region else {}),
        **submission.tokens._asdict(),
        **quote.marker_fields(),  # the rates it needs a price of
    }


def record(submission: Submission, now: datetime, settle: reservations.Settlement | None = None) -> Outcome:
    """Write a submission exactly once (with ``settle``'s settlement); a duplicate answers the original's outcome."""
    with _live_first([submission], now) as outcomes:
        outcomes.update(_write_chunk([(0, submission)], now, settle))
    return outcomes[0]


def _outcome(submission: Submission, marker: dict, duplicate: bool = False) -> Outcome:
    """What ``marker`` counted: the one ``submission`` wrote, or for a duplicate the first acceptance's
    (which keeps how the call was made, not the rates)."""
    return Outcome(
        submission.request_id,
        marker["model_label"],
        marker["org_day"],
        int(marker["shard_id"]),
        int(marker["cost_usd_micros"]),
        marker.get("price_source", ""),
        marker.get("profile_kind", IN_REGION),
        duplicate,
        pricing.applied_from_marker(marker) if duplicate else submission.quote.applied(),
    )


def record_group(submissions: list[Submission], now: datetime) -> list[Outcome | ApiError]:
    """Write distinct request ids exactly once: a record with nothing beside its marker (no estimated item or index
    entry) is a PutItem of its own, ``MARKER_THREADS`` at once; the others share transactions of up to 100 actions. A
    failed write answers its records' error; the others are written all the same."""
    entries = list(enumerate(submissions))
    alone = [[entry] for entry in entries if not entry[1].lists_day and _estimated(entry[1]) is None]
    with _live_first(submissions, now) as outcomes, ThreadPoolExecutor(max_workers=MARKER_THREADS) as pool:
        for written in pool.map(lambda chunk: _written_or_failed(chunk, now), alone):
            outcomes.update(written)
        for chunk in _chunks([(index, s) for index, s in entries if index not in outcomes], now):
            outcomes.update(_written_or_failed(chunk, now))
    return [outcomes[index] for index in range(len(submissions))]


def _written_or_failed(chunk: list[tuple[int, Submission]], now: datetime) -> dict[int, Outcome | ApiError]:
    try:
        return _write_chunk(chunk, now)
    except Exception as error:  # noqa: BLE001 - the batch's other records are written all the same
        return {index: as_api_error(error) for index, _ in chunk}


@contextmanager
def _live_first(submissions: list[Submission], now: datetime):
    """Around the writes of ``submissions`` (the block fills their outcomes by index): tight
    records' costs added to their live items before, and taken back after from those not
    counted. A crash in between leaves a live item too high, never too low."""
    records = {index: _record_args(s, now) for index, s in enumerate(submissions) if s.live}
    expires_at = usage_expires_at(max((s.day for s in submissions), default="19700101"))
    if records:
        usage.add_live(usage.live_costs_of(list(records.values())), expires_at)
    outcomes: dict[int, Outcome | ApiError] = {}
    try:
        yield outcomes
    finally:
        uncounted = [
            record
            for index, record in records.items()
            if not isinstance(outcome := outcomes.get(index), Outcome) or outcome.duplicate
        ]
        if uncounted:
            usage.add_live({where: -cost for where, cost in usage.live_costs_of(uncounted).items()}, expires_at)


# Label-days (scope, label, yyyymmdd) this container's records listed (``_as_answered``).
_listed = TTLCache(86_400)


def _as_answered(submission: Submission, statuses: list[dict]) -> Submission:
    """A record as the answer read before its write has it: live when its label-day is tight,
    listing the day while it has no total yet (unless this container listed it)."""
    status = next((s for s in statuses if (s["label"], s["org_day"]) == (submission.label, submission.day)), None)
    if status is None:
        return submission
    unlisted = status["aggregated_at"] is None and not _listed.get((submission.scope, submission.label, submission.day))
    return submission._replace(live=status["mode"] == TIGHT, lists_day=unlisted)


def _write_chunk(
    chunk: list[tuple[int, Submission]], now: datetime, settle: reservations.Settlement | None = None
) -> dict[int, Outcome]:
    """Write ``chunk``'s records in one transaction until each is counted; conflicts retried."""
    outcomes: dict[int, Outcome] = {}
    attempt = 0
    while chunk:
        records = [_record_args(submission, now, settles=bool(settle)) for _, submission in chunk]
        items = usage.group_items(records) + (settle.actions(attempt) if settle else [])
        try:
            counted_before = usage.write_group(items, len(chunk), attempt)
        except usage.Conflict:
            attempt += 1
            if attempt == TRANSACTION_ATTEMPTS:
                raise service_unavailable("Usage write kept conflicting with concurrent writes; retry") from None
            retry_pause(attempt)
            continue
        if not counted_before:
            outcomes.update(
                (index, _outcome(submission, record["marker"]))
                for (index, submission), record in zip(chunk, records, strict=True)
            )
            break
        outcomes.update(
            (chunk[position][0], _outcome(chunk[position][1], first, duplicate=True))
            for position, first in counted_before.items()
        )
        chunk = [entry for position, entry in enumerate(chunk) if position not in counted_before]
    return outcomes


def _chunks(entries: list[tuple[int, Submission]], now: datetime) -> list[list[tuple[int, Submission]]]:
    """``entries`` cut into groups whose transactions stay within 100 actions."""
    args = {index: _record_args(submission, now) for index, submission in entries}
    chunks: list[list[tuple[int, Submission]]] = [[]]
    for entry in entries:
        candidate = [args[index] for index, _ in [*chunks[-1], entry]]
        if chunks[-1] and usage.group_size(candidate) > usage.MAX_TRANSACTION_ACTIONS:
            chunks.append([entry])
        else:
            chunks[-1].append(entry)
    return [chunk for chunk in chunks if chunk]


def _record_args(submission: Submission, now: datetime, settles: bool = False) -> dict:
    """What ``usage.group_items`` takes of a record (``settles``: one settling a reservation)."""
    now_epoch = int(now.timestamp())
    estimated = _estimated(submission)
    token_counts = dict(zip(TOKEN_FIELDS, submission.tokens, strict=True))
    if not submission.tokens.cache_write_1h:  # a marker has the 1-hour part only when there is one
        del token_counts["cache_write_1h_input_tokens"]
    return {
        "dedup_key": submission.dedup_key,
        "marker_key": submission.marker_key,
        "live": submission.live,
        "lists_day": submission.lists_day,
        "scopes": list(submission.scopes),
        "label": submission.label,
        "day": submission.day,
        "now_epoch": now_epoch,
        "counts": {"cost_usd_micros": submission.cost_usd_micros},
        "marker": {
            "model_label": submission.label,
            "org_day": submission.day,
            "shard_id": submission.shard_id,
            "scopes": list(submission.scopes),  # what a void subtracts from (domain.voids)
            **token_counts,
            "cost_usd_micros": submission.cost_usd_micros,
            "price_source": submission.quote.source,
            "profile_kind": submission.quote.profile_kind,
            **submission.quote.marker_fields(),  # how the call was made (voids, re-pricing, duplicates)
            **({usage.SETTLED: submission.cost_usd_micros} if settles else {}),  # what a void takes back too
        },
        "expires_at": usage_expires_at(submission.day),
        # an estimated record's marker lives as long as its estimated item, so re-pricing sees a void
        "marker_expires_at": max(
            get_config().metering.marker_expires_at(now_epoch),
            usage_expires_at(submission.day) if estimated else 0,
        ),
        "estimated": estimated,
    }


def count(
    config: EffectiveConfig, submission: Submission, now: datetime, settle: reservations.Settlement | None = None
) -> Outcome:
    outcome = record(submission, now, settle)
    _after_counting(config, submission, outcome, now, settle)
    return outcome


def _after_counting(
    config: EffectiveConfig,
    submission: Submission,
    outcome: Outcome,
    now: datetime,
    settle: reservations.Settlement | None = None,
) -> None:
    """Note the listing and settlement; fire ``UNPRICED_MODEL`` for a new estimated record (failure logged)."""
    if submission.lists_day:
        _listed.put((submission.scope, submission.label, submission.day), True)
    if settle is not None:
        settle.counted(config, outcome.duplicate, now)
    if outcome.price_source == pricing.ESTIMATE and not outcome.duplicate:
        quote = submission.quote
        unpriced = alerts.Alert(alerts.UNPRICED_MODEL, submission.label, model_id=quote.model_id, region=quote.region)
        alerts.fire_once(config, submission.day, unpriced, now)


def _daily_status(config: EffectiveConfig, label: str, day: str, item: dict | None) -> dict:
    """A label's DailyTotal as of the last aggregation, with quota percentage and mode."""
    totals = Totals.from_item(item)
    quota = config.quota(label)
    status = quota_status(totals.cost_usd_micros, quota, config.tight_mode_threshold_pct) if quota > 0 else None
    return {
        "label": label,
        "org_day": day,
        "cost_usd_micros": totals.cost_usd_micros,
        "requests": totals.requests,
        "quota_usd_micros": quota,
        "quota_pct": quota_pct(totals.cost_usd_micros, quota),
        "status": status,
        "mode": TIGHT if status in (TIGHT, EXCEEDED) else NORMAL,
        "aggregated_at": (
            iso_utc(datetime.fromtimestamp(totals.updated_at_epoch, UTC)) if totals.updated_at_epoch else None
        ),
    }


def _accepted_body(outcome: Outcome, now: datetime) -> dict:
    return {
        "request_id": outcome.request_id,
        "status": "accepted",
        "message": (
            "Duplicate request_id: already accepted, not counted again"
            if outcome.duplicate
            else "Usage data queued for processing"
        ),
        "duplicate": outcome.duplicate,
        "processing": {
            "shard_id": outcome.shard_id,
            "expected_aggregation_lag_secs": get_config().metering.aggregation_lag_secs,
            "cost_usd_micros": outcome.cost_usd_micros,
        },
        "pricing": {
            "source": outcome.price_source,
            "version": parse_day(outcome.day).isoformat(),
            "profile_kind": outcome.profile_kind,
            **outcome.applied,
        },
        "timestamp": iso_utc(now),
    }


def quota_position(
    config: EffectiveConfig, counted: list[tuple[str, str]], now: datetime, asked: bool
) -> tuple[list[dict], dict, dict]:
    """(each counted label-day's ``_daily_status``, today's scope total against its cap, and
    ``{"model_selection": ...}`` when ``asked``: docs/api.md, "The selection with a report") as of the last
    aggregation, in one read. A store too busy for the selection leaves it out rather than answering 503."""
    today = org_day(config.timezone, now)
    shown = [
        *((keys.usage_key(config.scope, label), day) for label, day in counted),
        *((usage_key, today) for usage_key in scope_usage_keys(config.scope)),
    ]
    found, selected = None, {}
    if asked:
        try:
            carried = selection.carried(config, now, shown)
            found, selected = carried.items, {"model_selection": carried.selection}
        except (ApiError, ClientError, BotoCoreError) as error:
            if as_api_error(error).status != 503:
                raise
            logger.warning("selection left out of a usage answer: the store is busy")
    if found is None:
        found = daily_totals.read_days(shown)
    labels = [
        _daily_status(config, label, day, found.get((keys.usage_key(config.scope, label), day)))
        for label, day in counted
    ]
    # The scope's spend over every label; never below today's labels it was read with (the scope total may lag them).
    spend = max(
        scope_totals(config.scope, lambda usage_key: Totals.from_item(found.get((usage_key, today)))).cost_usd_micros,
        sum(status["cost_usd_micros"] for status in labels if status["org_day"] == today),
    )
    quota = config.total_quota
    total = {
        "org_day": today,
        "spend_usd_micros": spend,
        "quota_usd_micros": quota,
        "quota_pct": quota_pct(spend, quota),
        "status": quota_status(spend, quota, config.tight_mode_threshold_pct),
    }
    return labels, total, selected


def submit(
    org_id: str, app_id: str, request: UsageRequest, now: datetime | None = None, with_selection: bool = False
) -> dict:
    """``POST .../usage``: the 202 body (the label's DailyTotal; the selection when ``with_selection``)."""
    now = now or utc_now()
    config = boosts.boosted_config(org_id, app_id, now)
    submission = prepare(config, request, now)
    settle = reservations.settlement(config, submission, request.reservation_id)
    counted = [(submission.label, submission.day)]
    # the answer read first: the record as it has the label-day (``_as_answered``)
    position = quota_position(config, counted, now, with_selection)
    outcome = count(config, _as_answered(submission, position[0]), now, settle)
    if [(outcome.label, outcome.day)] != counted:  # a duplicate: the first acceptance's label-day
        position = quota_position(config, [(outcome.label, outcome.day)], now, with_selection)
    (label,), total, selected = position
    body = {**_accepted_body(outcome, now), "daily_total": label, "scope_total": total}
    body |= {"reservation": settle.summary(outcome.duplicate)} if settle else {}
    return body | selected


def _failed(raw, failure: ApiError) -> dict:
    """A batch record's failed result (``raw``: the record as sent)."""
    request_id = raw.get("request_id") if isinstance(raw, dict) else None
    return {
        "request_id": request_id[:64] if isinstance(request_id, str) else None,
        "status": "failed",
        "error": failure.code,
        "message": failure.message,
    }


class _Prepared(NamedTuple):
    submission: Submission
    settle: reservations.Settlement | None


def _prepare_all(config: EffectiveConfig, records: list, now: datetime) -> list[_Prepared | dict]:
    """Each record validated and priced with the reservation it settles, or its failed result."""
    _read_profiles_together(config, records)
    validated = [_one_record(raw, _validated, config, raw, now) for raw in records]
    named = [entry[1].reservation_id for entry in validated if isinstance(entry, tuple) and entry[1].reservation_id]
    try:
        holds: Mapping | ApiError = reservations.read_holds(config, named) if named else {}
    except Exception as error:  # noqa: BLE001 - only the records naming a hold fail for it
        holds = as_api_error(error)
    return [
        _one_record(raw, _settling, config, *entry, holds) if isinstance(entry, tuple) else entry
        for raw, entry in zip(records, validated, strict=True)
    ]


def _read_profiles_together(config: EffectiveConfig, records: list) -> None:
    """Read the profiles the batch names in one BatchGetItem, so each record finds its own cached;
    on failure each record reads its own, so a store error fails only the records it reaches."""
    named = [raw.get("model_label") for raw in records if isinstance(raw, dict)]
    try:
        profiles.known_labels(config, [label for label in named if isinstance(label, str) and is_label(label)])
    except (ApiError, BotoCoreError, ClientError):
        logger.warning("a batch's profile read failed; its records read their own", exc_info=True)


def _validated(config: EffectiveConfig, raw, now: datetime) -> tuple[Submission, UsageRequest]:
    request = UsageRequest.model_validate(raw)
    return prepare(config, request, now), request


def _settling(
    config: EffectiveConfig, submission: Submission, request: UsageRequest, holds: Mapping | ApiError
) -> _Prepared:
    if isinstance(holds, ApiError) and request.reservation_id:
        raise holds  # the batch's read of the holds failed (a busy store: 503)
    return _Prepared(submission, reservations.settlement(config, submission, request.reservation_id, holds))


def _one_record(raw, step: Callable, *args):
    """``step(*args)``, or ``raw``'s failed result: one record's fault never fails the others."""
    try:
        return step(*args)
    except ValidationError:
        return _failed(raw, invalid_request("Request validation failed"))
    except Exception as error:  # noqa: BLE001 - one record's fault must not fail the others
        return _failed(raw, as_api_error(error))


def _count_batch(
    config: EffectiveConfig, prepared: list, now: datetime, client: str | None = None
) -> dict[int, tuple[dict, Outcome | None]]:
    """Each prepared record's result and outcome, by index: plain records written together, one settling a reservation
    alone; a repeated request id is a duplicate of the first without a write, or alone if the first failed."""
    first_of: dict[str, int] = {}
    together, alone, repeats = [], [], []
    for index, entry in enumerate(prepared):
        if isinstance(entry, _Prepared):
            key = entry.submission.dedup_key
            (repeats if key in first_of else together if entry.settle is None else alone).append(index)
            first_of.setdefault(key, index)
    done: dict[int, tuple[dict, Outcome | None]] = {}
    written = record_group([prepared[index].submission for index in together], now) if together else []
    for index, outcome in zip(together, written, strict=True):
        submission = prepared[index].submission
        if isinstance(outcome, ApiError):
            done[index] = _failed({"request_id": submission.request_id}, outcome), None
        else:
            _after_counting(config, submission, outcome, now)
            done[index] = _accepted_result(outcome, None), outcome
    for index in alone:
        done[index] = _count_alone(config, prepared[index], now, client)
    for index in repeats:
        first = done[first_of[prepared[index].submission.dedup_key]][1]
        if first is None:  # the first failed: this one may count
            done[index] = _count_alone(config, prepared[index], now, client)
        else:
            outcome = first._replace(duplicate=True)
            done[index] = _accepted_result(outcome, prepared[index].settle), outcome
    return done


def _count_alone(
    config: EffectiveConfig, entry: _Prepared, now: datetime, client: str | None
) -> tuple[dict, Outcome | None]:
    """One batch record written on its own, charged to ``client``'s ``usage`` limit first."""
    submission, settle = entry
    try:
        if client is not None:
            ratelimit.consume(
                client, limit_name=USAGE_LIMIT, requests=config.rate_limits.get(USAGE_LIMIT), headers=False
            )
        outcome = count(config, submission, now, settle)
    except Exception as error:  # noqa: BLE001 - one record's fault must not fail the others
        return _failed({"request_id": submission.request_id}, as_api_error(error)), None
    return _accepted_result(outcome, settle), outcome


def _accepted_result(outcome: Outcome, settle: reservations.Settlement | None) -> dict:
    return {
        "request_id": outcome.request_id,
        "status": "accepted",
        "shard_id": outcome.shard_id,
        "cost_usd_micros": outcome.cost_usd_micros,
        "duplicate": outcome.duplicate,
        **({"reservation": settle.summary(outcome.duplicate)} if settle else {}),
    }


def submit_batch(
    org_id: str,
    app_id: str,
    records: list,
    now: datetime | None = None,
    with_selection: bool = False,
    client: str | None = None,
) -> dict:
    """``POST .../usage/batch``: each record validated and written exactly once on its own merits (``_count_batch``),
    with each counted label's quota position (``daily_totals``); ``client`` is charged for records written alone."""
    now = now or utc_now()
    config = boosts.boosted_config(org_id, app_id, now)
    prepared = _prepare_all(config, records, now)
    submissions = [entry.submission for entry in prepared if isinstance(entry, _Prepared)]
    label_days = list(dict.fromkeys((submission.label, submission.day) for submission in submissions))
    # the answer read first, as a single report's (``_as_answered``); read again if what counted differs
    read_first = quota_position(config, label_days, now, with_selection)
    prepared = [
        entry._replace(submission=_as_answered(entry.submission, read_first[0]))
        if isinstance(entry, _Prepared)
        else entry
        for entry in prepared
    ]
    counted = _count_batch(config, prepared, now, client)
    done = [counted.get(index, (entry, None)) for index, entry in enumerate(prepared)]
    results = [result for result, _ in done]
    accepted = sum(1 for result in results if result["status"] == "accepted")
    labels_counted = list(dict.fromkeys((outcome.label, outcome.day) for _, outcome in done if outcome is not None))
    labels, total, selected = (
        read_first if labels_counted == label_days else quota_position(config, labels_counted, now, with_selection)
    )
    return {
        "accepted": accepted,
        "failed": len(results) - accepted,
        "results": results,
        "daily_totals": labels,
        "scope_total": total,
        "timestamp": iso_utc(now),
    } | selected
