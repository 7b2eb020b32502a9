"""Reservations, a hard daily cap: hold a call's worst-case cost before the call, settle its actual cost after it.

The quota check and the hold are one atomic step: a TransactWriteItems that puts the hold and ADDs its amount to each
ledger's ``committed`` under ``committed <= quota − unreserved spend − amount``, so DynamoDB serialises two
reservations racing for the last headroom: the second's condition sees what the first left. Settlement (in the usage
write's transaction, exactly once by its dedup marker), release and expiry each delete the hold under
``attribute_exists``, so each gives its amount back once. A ledger is named by its total's usage key and its org day
(``slices.LedgerDay``). See docs/hard-cap.md.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from botocore.exceptions import BotoCoreError, ClientError

from ..bodies import ReservationRequest
from ..config import get_config
from ..errors import ApiError, invalid_request, service_unavailable
from ..observability import logger
from ..store import daily_totals, keys
from ..store import reservations as store
from ..timeutil import iso_utc, org_day, parse_day, utc_now
from . import alerts, boosts, pricing, profiles, slices
from .aggregation import read_daily_totals, scope_totals, scope_usage_keys, usage_expires_at
from .orgs import EffectiveConfig

HOLD_RETENTION_SECS = 2 * 86400  # a hold's item outlives its expiry (TTL), so a sweep can still release it
# expired holds one refusal ends within its own request: a backlog of them is ended a page
# at a time by later refusals, so no refusal's cost grows with the backlog
SWEEP_LIMIT = 25
FROM_SLICE = "from_slice"  # a hold granted from a container's slice: its end is netted later
_ID = re.compile(r"^(\d{8})-([oa])-(\d{10})-([0-9a-f]{32})$")


class ReservationId(NamedTuple):
    """What a reservation id encodes: the hold's key (org day, scope kind, expiry, token)."""

    day: str
    kind: str  # "o": the org's scope, "a": the app's
    expires_epoch: int
    token: str

    def __str__(self) -> str:
        return f"{self.day}-{self.kind}-{self.expires_epoch:010d}-{self.token}"

    @classmethod
    def parse(cls, text: str) -> ReservationId | None:
        found = _ID.match(text) if isinstance(text, str) else None
        return cls(found[1], found[2], int(found[3]), found[4]) if found else None

    def key(self, org_id: str, app_id: str) -> dict:
        scope = keys.scope_key(org_id, app_id, "ORG" if self.kind == "o" else "APP")
        return keys.reservation_key(scope, self.day, self.expires_epoch, self.token)


def _quota_ledgers(scopes: Sequence[str], label: str) -> list[str]:
    """The label's ledger in the quota scope, then each scope total's (the quota scope's, then the capped app's own)."""
    return [keys.usage_key(scopes[0], label), *(keys.scope_total_key(scope) for scope in scopes)]


def _ledger_set(config: EffectiveConfig, label: str) -> list[str]:
    """The ledgers a hold of ``label`` adds to: its quota ledgers and, in ORG scope, the app's own scope total's,
    which bounds the app to its share of the scope's headroom (an uncapped app's, of its holds alone)."""
    ledgers = _quota_ledgers(config.counted_scopes, label)
    if config.app_counter is not None and keys.scope_total_key(config.app_counter) not in ledgers:
        ledgers.append(keys.scope_total_key(config.app_counter))
    return ledgers


def _held_ledgers(item: dict, day: str) -> list[slices.LedgerDay]:
    """The ledgers a hold's amount was added to, as it recorded them: a cap set or dropped
    while it is held does not change where its amount is taken back from."""
    return [(usage_key, day) for usage_key in item["ledgers"]]


def _part(ledger: slices.LedgerDay, committed: int, settled: int, room: int | None = None) -> store.Netted:
    """A ledger's ADD (``store.ledger_update``, ``store.net``), under ``room`` when given."""
    usage_key, day = ledger
    return store.Netted(store.ledger_key(usage_key, day), committed, settled, usage_expires_at(day), room)


def _refund_parts(deltas: Mapping[slices.LedgerDay, Sequence[int]]) -> list[store.Netted]:
    return [
        _part(ledger, committed, settled) for ledger, (committed, settled) in deltas.items() if committed or settled
    ]


def void_actions(scopes: Sequence[str], label: str, day: str, settled: int) -> list[dict]:
    """A voided settling record's actual cost taken off its ledgers (``committed`` and
    ``settled``), as the void takes it off its totals: the hold room it used is free again."""
    return [
        store.ledger_update(_part((usage_key, day), -settled, -settled)) for usage_key in _quota_ledgers(scopes, label)
    ]


def worst_case(config: EffectiveConfig, label: str, request: ReservationRequest, day: str) -> int | None:
    """The most the call can cost on ``label``, priced in the request's ``calling_region`` as its settling record will
    be (else as model selection prices it), at its service tier, latency-optimized or not, at the long-context rate
    when its bounds are over the model's threshold, and every cache write at the dearer of the 5-minute and 1-hour
    rates; None when the label cannot be priced now or the request is over its token caps."""
    max_input, max_output = get_config().token_caps(label)
    over_caps = max(request.max_input_tokens, request.max_cache_write_input_tokens) > max_input
    if over_caps or request.max_output_tokens > max_output or profiles.known_label(config, label) is None:
        return None
    tokens = pricing.Tokens(
        request.max_input_tokens, request.max_output_tokens, 0, request.max_cache_write_input_tokens
    )
    try:
        priced = profiles.priced_model(config, label, request.calling_region)
        quote = pricing.price_of(priced, parse_day(day), pricing.Dimensions.of(request), tokens, config.org_id)
    except ApiError:
        return None
    if quote.prices.cache_write_1h > quote.prices.cache_write:
        tokens = tokens._replace(cache_write_1h=tokens.cache_write)
    return pricing.cost_usd_micros(tokens, quote.prices)


def _candidates(config: EffectiveConfig, request: ReservationRequest, day: str) -> list[tuple[str, int]]:
    if request.model_label is None:
        labels = list(config.model_ordering)
    elif profiles.known_label(config, request.model_label) is None:
        raise ApiError(
            400,
            "INVALID_MODEL_LABEL",
            "Model label not defined in config",
            {"model_label": request.model_label, "valid_labels": sorted(get_config().labels)},
        )
    else:
        labels = [request.model_label]
    priced = [(label, worst_case(config, label, request, day)) for label in labels]
    if request.model_label is not None and priced[0][1] is None:
        raise invalid_request(
            "The reservation exceeds the label's token caps or the label cannot be priced",
            model_label=request.model_label,
        )
    return [(label, amount) for label, amount in priced if amount is not None]


class Attempt(NamedTuple):
    reservation: ReservationId | None  # None: refused
    label_reserved: int  # what the label's and the scope's ledgers held when read, before the hold
    total_reserved: int


def _fingerprint(config: EffectiveConfig, label: str) -> tuple:
    """The limits a slice is leased under: a slice of other limits grants nothing."""
    return (
        config.quota(label),
        config.total_quota,
        config.app_daily_cap_usd_micros,
        get_config().metering.app_hold_share_pct if config.app_counter is not None else None,
    )


class _Rooms(NamedTuple):
    """A ledger set as read: each ledger's room for a hold of ``size`` (``room(size)``: the
    most its ``committed`` may be before the write), what it has left and its limit."""

    base: list[int]  # room for a hold of 0 (the share's part computed for ``amount``)
    left: list[int]  # ``base`` less the ledger's ``committed``
    limits: list[int]  # (the near-cap rule)

    def room(self, size: int) -> list[int]:
        return [room - size for room in self.base]

    def lease_size(self, wanted: int, amount: int) -> int:
        """What to lease: ``wanted``, at most ``1 / LEFT_SLICES`` of what any ledger has left (so the containers'
        slices together keep little of it), or the call's ``amount`` alone near a cap: when that leaves under two
        calls, or the lease would leave under ``NEAR_PERCENT`` of a ledger's limit."""
        size = min(wanted, min(self.left) // slices.LEFT_SLICES)
        limits = zip(self.left, self.limits, strict=True)
        near = any(have - size < limit * slices.NEAR_PERCENT // 100 for have, limit in limits)
        return amount if size < 2 * amount or near else size


def _rooms(config: EffectiveConfig, label: str, amount: int, ledgers: list[str], read) -> _Rooms:
    """Each ledger's room as the per-call hold has it (``quota − unreserved spend − size``;
    the app's share of the scope's headroom in ORG scope)."""
    scope_spend, *app_spend = (scope_totals(scope, read.of) for scope in config.counted_scopes)
    limits = [config.quota(label), config.total_quota, *(config.app_daily_cap_usd_micros for _ in app_spend)]
    base = [
        config.quota(label) - read.of(ledgers[0]).unreserved,
        config.total_quota - scope_spend.unreserved,
        *(config.app_daily_cap_usd_micros - spend.unreserved for spend in app_spend),
    ]
    if config.app_counter is not None:
        # the app's live holds (its ledger's committed less settled) within its share, or one
        # call's when it holds none (near the cap a share is below a call; the cap still fills)
        share = (config.total_quota - scope_spend.unreserved) * get_config().metering.app_hold_share_pct // 100
        allowed = max(share, amount)
        if len(base) == len(ledgers):  # a capped app: its cap's ledger, whose settled spend is no hold
            base[-1] = min(base[-1], allowed + read.of(ledgers[-1]).settled)
        else:
            base.append(allowed)
            limits.append(max(share, 0))
    return _Rooms(base, [room - read.of(ledger).committed for ledger, room in zip(ledgers, base, strict=True)], limits)


def _try_hold(config: EffectiveConfig, day: str, label: str, amount: int, ttl_secs: int, now: datetime) -> Attempt:
    """Hold ``amount`` on ``label`` if its quota, the scope's total cap and (ORG scope) the app's daily cap and its
    share of the scope's headroom all have room: from this container's slice when it covers the call (one PutItem),
    else with one transaction that puts the hold and leases a new slice (or, near a cap, exactly the call's amount),
    netting the container's old slice and pending refunds of those ledgers into it."""
    kept, ledgers = slices.current(), _ledger_set(config, label)
    key, fingerprint = (day, tuple(ledgers)), _fingerprint(config, label)
    kind = "o" if config.scope == keys.org_key(config.org_id) else "a"
    expires_epoch = int(now.timestamp()) + ttl_secs
    rid = ReservationId(day, kind, expires_epoch, secrets.token_hex(16))
    attributes = {
        "reservation_id": str(rid),
        "app_id": config.app_id,
        "label": label,
        "amount_usd_micros": amount,
        "expires_epoch": expires_epoch,
        "ledgers": ledgers,
    }
    hold = store.hold_put(rid.key(config.org_id, config.app_id), attributes, expires_epoch + HOLD_RETENTION_SECS)
    sliced_hold = {**hold, FROM_SLICE: True}
    if kept.take(key, fingerprint, amount):
        # covered by the slice's committed capacity; a Put that fails is not given back to
        # the slice (it may have been written: its expiry then gives the amount back)
        store.put_hold(sliced_hold)
        return Attempt(rid, 0, 0)
    read = read_daily_totals(
        [ledgers[0], *(usage_key for scope in config.counted_scopes for usage_key in scope_usage_keys(scope))],
        day,
        consistent=True,
        ledgers=True,
    )
    rooms = _rooms(config, label, amount, ledgers, read)
    refused = Attempt(None, read.of(ledgers[0]).reserved, scope_totals(config.counted_scopes[0], read.of).reserved)
    if min(rooms.room(amount)) < 0:  # no room whatever is given back (it is all in committed)
        _give_back(kept, kept.claim(key))
        return refused
    size = rooms.lease_size(kept.next_size(key, amount), amount)
    claim = kept.claim(key)
    for lease in dict.fromkeys((size, amount)):  # a slice refused: the call alone
        try:
            _net(claim, lease, rooms.room(lease), sliced_hold if lease > amount else hold)
        except store.Refused:
            continue
        except store.Conflict:
            kept.unclaim(claim)
            raise service_unavailable("Reservation kept conflicting with concurrent writes; retry") from None
        except store.Unsure:
            raise service_unavailable("The store did not answer the reservation; retry") from None
        except BaseException:
            kept.unclaim(claim)  # a definite error: nothing was written
            raise
        kept.leased(key, fingerprint, lease, amount)
        if daily_totals.RESERVING not in read.items.get(ledgers[1], {}):
            store.mark_reserving(ledgers[1], day, usage_expires_at(day))
        return refused._replace(reservation=rid)
    _give_back(kept, claim)
    return refused


def _net(claim: slices.Claim, size: int, rooms: list[int], hold: dict) -> None:
    """Put ``hold`` and ADD ``size`` less the claim's free slice and pending refunds to each ledger of the claim's
    set, each under its room for ``size`` plus what the write gives back to it (given back in the same write, so it is
    room); the claim's other deltas ride along unconditioned (each a refund: it only lowers ``committed``)."""
    day, usage_keys = claim.key
    refunds = claim.refunds()
    parts = []
    for usage_key, room in zip(usage_keys, rooms, strict=True):
        committed, settled = refunds.pop((usage_key, day), (0, 0))
        parts.append(_part((usage_key, day), size + committed, settled, room - committed))
    store.net(parts + _refund_parts(refunds), hold)


def _give_back(kept: slices.Slices, *claims: slices.Claim) -> None:
    """Write claims back alone, netted into one write (a refusal's, an idle container's: what
    it kept is room for the others): each free slice off its set's ledgers, the pending deltas."""
    claims = tuple(claim for claim in claims if claim)
    refunds: dict[slices.LedgerDay, list[int]] = {}
    for claim in claims:
        slices.add(refunds, claim.refunds())
    parts, start = _refund_parts(refunds), 0
    try:
        for start in range(0, len(parts), store.MAX_NETTED):
            store.net(parts[start : start + store.MAX_NETTED])
    except (store.Conflict, BotoCoreError, ClientError):
        if start == 0:  # nothing written: kept for the next write
            for claim in claims:
                kept.unclaim(claim)
        logger.warning("refunds not written (a part written already: the rest left out)", exc_info=True)
    except store.Unsure:  # it may be in: never written a second time (left out, its headroom stays held)
        logger.warning("refunds unanswered: left out", exc_info=True)


def flush(kept: slices.Slices | None = None, force: bool = False) -> None:
    """Write back what this container kept long enough (``Slices.due``: idle slices, pending
    refunds), or everything (``force``). Never fails its caller: what was not written is kept."""
    kept = kept or slices.current()
    _give_back(kept, *kept.due(force))


def _end_hold(day: str, item: dict) -> bool:
    """Delete a live hold and give its amount back to its ledgers, at most once (the delete is conditional): True when
    this call ended it; ``store.Conflict`` to retry. A slice's hold gives it back later (``FROM_SLICE``)."""
    delete = store.delete_hold({"scope_key": item["scope_key"], "date_key": item["date_key"]})
    refund = {ledger: (-int(item["amount_usd_micros"]), 0) for ledger in _held_ledgers(item, day)}
    if not item.get(FROM_SLICE):
        return store.end([delete, *(store.ledger_update(_part(ledger, *delta)) for ledger, delta in refund.items())])
    ended = store.end([delete])
    if ended:
        slices.current().defer(refund)
    return ended


def sweep(scope: str, day: str, now: datetime) -> int:
    """End up to ``SWEEP_LIMIT`` holds of ``scope`` and ``day`` expired by ``now``, the
    longest expired first (each exactly once): how many this call ended."""
    ended = 0
    for item in store.expired(scope, day, int(now.timestamp()), SWEEP_LIMIT):
        try:
            ended += _end_hold(day, item)
        except store.Conflict:
            logger.info("expired hold raced; the next sweep ends it", extra={"hold": item["reservation_id"]})
    return ended


def reserve(org_id: str, app_id: str, request: ReservationRequest, now: datetime | None = None) -> dict:
    """``POST .../reservations``: the 201 body; 429 ``QUOTA_EXCEEDED`` when no label (the first in the ordering, or
    the given one) and the scope's total cap can hold the call's worst case, even after ending expired holds
    (``sweep``). The 429 tells what was held when each label was read: with nothing held, a refusal is final until a
    quota changes; otherwise a hold may yet settle below its amount and free headroom."""
    now = now or utc_now()
    profiles.check_calling_region(request.calling_region)
    bounds = (request.max_input_tokens, request.max_output_tokens, request.max_cache_write_input_tokens)
    if not any(bounds):  # a hold of 0 keeps no headroom, yet costs a write and, once expired, a refusal's sweep
        raise invalid_request(
            "Every token bound is 0: a reservation would hold nothing",
            max_input_tokens=0,
            max_output_tokens=0,
            max_cache_write_input_tokens=0,
        )
    config = boosts.boosted_config(org_id, app_id, now)
    day = org_day(config.timezone, now)
    candidates = _candidates(config, request, day)
    flush()
    seen: dict[str, Attempt] = {}
    for attempt in range(2):
        for label, amount in candidates:
            seen[label] = _try_hold(config, day, label, amount, request.ttl_secs, now)
            rid = seen[label].reservation
            if rid is not None:
                return {
                    "reservation_id": str(rid),
                    "label": label,
                    "bedrock_model_id": profiles.bedrock_id(config, label),
                    "amount_usd_micros": amount,
                    "expires_at": iso_utc(datetime.fromtimestamp(rid.expires_epoch, UTC)),
                }
        if attempt == 0 and not sweep(config.scope, day, now):
            break
    raise ApiError(
        429,
        "QUOTA_EXCEEDED",
        "No label's remaining daily quota can hold the call's worst-case cost",
        {
            "org_id": org_id,
            "app_id": app_id,
            "date": parse_day(day).isoformat(),
            "worst_case_usd_micros": {label: amount for label, amount in candidates},
            "reserved_usd_micros": {label: tried.label_reserved for label, tried in seen.items()},
            "total_reserved_usd_micros": max((tried.total_reserved for tried in seen.values()), default=0),
        },
        headers={"Retry-After": "1"},
    )


def release(org_id: str, app_id: str, reservation_id: str) -> None:
    """``DELETE .../reservations/{id}``: give a live hold back (idempotent: a hold already
    settled, released or expired, or an unknown id, is a no-op)."""
    rid = parse_issued(reservation_id)
    key = rid.key(org_id, app_id)
    for _ in range(store.CONFLICT_ATTEMPTS):
        item = store.read(key)
        if item is None or item["app_id"] != app_id:
            return
        try:
            _end_hold(rid.day, item)
        except store.Conflict:
            continue
        flush()
        return
    raise service_unavailable("Release kept conflicting with concurrent writes; retry")


class Settlement:
    """The settlement of one usage record carrying a ``reservation_id``: extra actions for the usage write's
    transaction (``metering.record``), rebuilt on each attempt so a hold ended meanwhile (released, expired) is then
    counted as plain reserved-path spend. Whatever the hold's state, the record's actual cost is ADDed to its day's
    ledgers (``committed`` and ``settled``); a hold still live is deleted and its amount taken back."""

    def __init__(self, config: EffectiveConfig, submission, reservation_id: str, holds: Mapping | None = None):
        self.rid = parse_issued(reservation_id)
        self.reservation_id = reservation_id
        self.app_id, self.submission = config.app_id, submission
        self.key = self.rid.key(config.org_id, config.app_id)
        found = store.read(self.key) if holds is None else holds.get((self.key["scope_key"], self.key["date_key"]))
        self.item = self._own(found)
        if self.item is not None and self.item["label"] != submission.label:
            raise invalid_request(
                "model_label differs from the reservation's label",
                model_label=submission.label,
                reservation_label=self.item["label"],
            )
        self.settled_amount: int | None = None  # the hold this record's write ended, when it did
        self.kept = slices.current()  # the container this settlement's refund is netted in
        self.deferred: dict[slices.LedgerDay, tuple[int, int]] = {}  # that refund, once written

    def _own(self, item: dict | None) -> dict | None:
        return item if item is not None and item["app_id"] == self.app_id else None

    def actions(self, attempt: int) -> list[dict]:
        if attempt:
            self.item = self._own(store.read(self.key))
        sub = self.submission
        deltas = {
            (usage_key, sub.day): [sub.cost_usd_micros, sub.cost_usd_micros]
            for usage_key in _quota_ledgers(sub.scopes, sub.label)
        }
        actions = []
        self.settled_amount = None
        if self.item is not None:
            self.settled_amount = int(self.item["amount_usd_micros"])
            actions.append(store.delete_hold(self.key))
            slices.add(deltas, {ledger: (-self.settled_amount, 0) for ledger in _held_ledgers(self.item, self.rid.day)})
        # a hold of a slice: what gives room back (and settled spend beside it) waits in the container, netted into
        # its next ledger write (``counted``); what takes room (cost above the hold, another day's spend) is written now
        sliced = self.item is not None and self.item.get(FROM_SLICE)
        self.deferred = {ledger: tuple(delta) for ledger, delta in deltas.items() if sliced and delta[0] <= 0}
        return actions + [
            store.ledger_update(_part(ledger, *delta))
            for ledger, delta in deltas.items()
            if ledger not in self.deferred
        ]

    def _over(self, duplicate: bool) -> int:
        """Actual cost above the hold this record's write ended (0 when it ended none)."""
        held = None if duplicate else self.settled_amount
        return 0 if held is None else max(0, self.submission.cost_usd_micros - held)

    def counted(self, config: EffectiveConfig, duplicate: bool, now: datetime) -> None:
        """After the write: a slice hold's refund handed to the container (``actions``; a duplicate's write ended
        nothing), and actual cost above the hold raises ``OVER_RESERVATION``."""
        if not duplicate and self.deferred:
            self.kept.defer(self.deferred)
        self.deferred = {}
        flush(self.kept)
        over = self._over(duplicate)
        if not over:
            return
        logger.warning("usage above its reservation", extra={"reservation_id": self.reservation_id, "over": over})
        alerts.fire_once(config, self.submission.day, alerts.Alert(alerts.OVER_RESERVATION, self.submission.label), now)

    def summary(self, duplicate: bool) -> dict:
        """The usage reply's ``reservation`` field."""
        held = None if duplicate else self.settled_amount
        return {
            "reservation_id": self.reservation_id,
            "settled": held is not None,
            "amount_usd_micros": held,
            "over_reservation_usd_micros": self._over(duplicate),
        }


def settlement(
    config: EffectiveConfig, submission, reservation_id: str | None, holds: Mapping | None = None
) -> Settlement | None:
    """The settlement of a record carrying ``reservation_id`` (None without one); ``holds``:
    its hold read already (``read_holds``), else it is read now."""
    return Settlement(config, submission, reservation_id, holds) if reservation_id else None


def parse_issued(reservation_id: str) -> ReservationId:
    rid = ReservationId.parse(reservation_id)
    if rid is None:
        raise invalid_request("reservation_id is not one this service issued", reservation_id=reservation_id[:80])
    return rid


def read_holds(config: EffectiveConfig, reservation_ids: list[str]) -> dict[tuple[str, str], dict]:
    """The holds a batch's records name, in one read (``store.read_many``); ids this service
    did not issue are left out (their records fail on their own)."""
    rids = filter(None, map(ReservationId.parse, reservation_ids))
    return store.read_many([rid.key(config.org_id, config.app_id) for rid in rids])
