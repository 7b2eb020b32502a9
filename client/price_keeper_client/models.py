"""Typed views of the service's answers. Each keeps the decoded JSON in ``raw`` so fields
this client does not model yet stay reachable."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import parse_timestamp

QUOTA_STATES = ("NORMAL", "TIGHT", "EXCEEDED")
PRICE_FIELDS = (
    "input_price_usd_micros_per_1m",
    "output_price_usd_micros_per_1m",
    "cache_read_price_usd_micros_per_1m",
    "cache_write_price_usd_micros_per_1m",
)


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(value: Any) -> datetime | None:
    return parse_timestamp(value) if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Pricing:
    """The selected label's prices (micro-USD per 1M tokens of each kind) and their origin."""

    input_price_usd_micros_per_1m: int
    output_price_usd_micros_per_1m: int
    cache_read_price_usd_micros_per_1m: int = 0
    cache_write_price_usd_micros_per_1m: int = 0
    version: str | None = None
    source: str | None = None
    profile_kind: str | None = None

    @classmethod
    def from_json(cls, body: dict | None) -> Pricing | None:
        if not body:
            return None
        return cls(
            *(int(body.get(name, 0)) for name in PRICE_FIELDS),
            version=body.get("version"),
            source=body.get("source"),
            profile_kind=body.get("profile_kind"),
        )


@dataclass(frozen=True)
class ModelChoice:
    """``GET .../model-selection``: which model to call now, and for how long to trust that."""

    label: str
    bedrock_model_id: str
    reason: str
    mode: str
    quota_pct: float | None
    cache_duration_secs: int
    check_frequency: str | None
    pricing: Pricing | None
    org_day: str | None
    checked_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict) -> ModelChoice:
        recommended = body["recommended_model"]
        quota = body.get("quota_status") or {}
        guidance = body.get("client_guidance") or {}
        return cls(
            label=recommended["label"],
            bedrock_model_id=recommended["bedrock_model_id"],
            reason=recommended.get("reason", "NORMAL"),
            mode=quota.get("mode", "NORMAL"),
            quota_pct=quota.get("quota_pct"),
            cache_duration_secs=int(guidance.get("cache_duration_secs", 60)),
            check_frequency=guidance.get("check_frequency"),
            pricing=Pricing.from_json(body.get("pricing")),
            org_day=body.get("org_day"),
            checked_at=_time(body.get("checked_at")),
            raw=body,
        )


@dataclass(frozen=True)
class CarriedSelection:
    """The model selection a usage answer carried because the report asked for it
    (``?model_selection=true``): ``choice`` is ``None`` when every label is spent (the
    selection endpoint answers ``429 QUOTA_EXCEEDED`` then)."""

    choice: ModelChoice | None

    @classmethod
    def find(cls, body: dict) -> CarriedSelection | None:
        """``None`` when the answer carries no selection (none was asked for)."""
        if "model_selection" not in body:
            return None
        value = body["model_selection"]
        return cls(ModelChoice.from_json(value) if isinstance(value, dict) else None)


@dataclass(frozen=True)
class UsageRecord:
    """One Bedrock call's token usage. The service prices it; clients never send cost."""

    request_id: str
    model_label: str
    bedrock_model_id: str
    input_tokens: int
    output_tokens: int
    timestamp: datetime
    status: str = "OK"
    calling_region: str | None = None
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0  # every cache write, the 1-hour ones included
    reservation_id: str | None = None  # settles this reservation (hard cap)
    cache_write_1h_input_tokens: int = 0  # the part of the cache writes made with the 1-hour TTL
    service_tier: str = "default"  # Bedrock's serviceTier.type: default, priority, flex or reserved
    latency_optimized: bool = False  # performanceConfig.latency = optimized
    inference_type: str = "ON_DEMAND"  # BATCH: a record of a batch inference job's output

    def to_json(self) -> dict:
        body = {
            "request_id": self.request_id,
            "model_label": self.model_label,
            "bedrock_model_id": self.bedrock_model_id,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "status": self.status,
            "timestamp": iso_utc(self.timestamp),
        }
        if self.calling_region:
            body["calling_region"] = self.calling_region
        # Sent only when non-zero, so servers that predate prompt-cache pricing accept the record.
        if self.cache_read_input_tokens:
            body["cache_read_input_tokens"] = self.cache_read_input_tokens
        if self.cache_write_input_tokens:
            body["cache_write_input_tokens"] = self.cache_write_input_tokens
        if self.reservation_id:
            body["reservation_id"] = self.reservation_id
        # How the call was made: sent only when not the default, as the cache counts are.
        if self.cache_write_1h_input_tokens:
            body["cache_write_1h_input_tokens"] = self.cache_write_1h_input_tokens
        if self.service_tier != "default":
            body["service_tier"] = self.service_tier
        if self.latency_optimized:
            body["latency_optimized"] = True
        if self.inference_type != "ON_DEMAND":
            body["inference_type"] = self.inference_type
        return body


@dataclass(frozen=True)
class Reservation:
    """``POST .../reservations`` (hard cap): the label to call and the worst-case cost held
    for it until a usage record with ``reservation_id`` settles it, a release, or ``expires_at``."""

    reservation_id: str
    label: str
    bedrock_model_id: str | None
    amount_usd_micros: int
    expires_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict) -> Reservation:
        return cls(
            reservation_id=body["reservation_id"],
            label=body["label"],
            bedrock_model_id=body.get("bedrock_model_id"),
            amount_usd_micros=int(body.get("amount_usd_micros", 0)),
            expires_at=_time(body.get("expires_at")),
            raw=body,
        )

    def as_choice(self) -> ModelChoice:
        """The reserved label as the model to call (a reservation replaces model selection)."""
        return ModelChoice(
            label=self.label,
            bedrock_model_id=self.bedrock_model_id or self.label,
            reason="RESERVED",
            mode="NORMAL",
            quota_pct=None,
            cache_duration_secs=0,
            check_frequency=None,
            pricing=None,
            org_day=None,
            checked_at=None,
            raw=self.raw,
        )


@dataclass(frozen=True)
class LabelQuota:
    """The quota position of one label as a usage answer reports it (when the server includes it)."""

    label: str | None
    quota_pct: float | None
    status: str | None
    reason: str | None

    @classmethod
    def from_json(cls, value: dict) -> LabelQuota:
        status = value.get("status") or value.get("mode") or value.get("quota_status")
        return cls(
            value.get("label") or value.get("model_label"),
            value.get("quota_pct"),
            status if status in QUOTA_STATES else None,
            value.get("reason"),
        )

    @classmethod
    def find(cls, body: dict) -> LabelQuota | None:
        """Looks for ``daily_total`` (this service's usage answer), ``quota`` or ``quota_status``,
        at the top level or under ``processing``."""
        for holder in (body, body.get("processing") or {}):
            for key in ("daily_total", "quota", "quota_status"):
                value = holder.get(key)
                if isinstance(value, dict):
                    return cls.from_json(value)
        return None


@dataclass(frozen=True)
class ScopeTotal:
    """The scope's spend of today over every label against its total daily cap, as a usage
    answer reports it (``scope_total``, when the server includes it)."""

    org_day: str | None
    spend_usd_micros: int
    quota_usd_micros: int
    quota_pct: float | None
    status: str | None

    @classmethod
    def from_json(cls, value: dict | None) -> ScopeTotal | None:
        if not isinstance(value, dict):
            return None
        status = value.get("status")
        return cls(
            value.get("org_day"),
            int(value.get("spend_usd_micros", 0)),
            int(value.get("quota_usd_micros", 0)),
            value.get("quota_pct"),
            status if status in QUOTA_STATES else None,
        )


@dataclass(frozen=True)
class ReservationSettlement:
    """How a usage record carrying ``reservation_id`` settled it: ``settled`` when this record
    ended the live hold (``amount_usd_micros``), not for a duplicate or a hold already ended;
    ``over_reservation_usd_micros`` is the actual cost above the hold (counted, and flagged)."""

    reservation_id: str
    settled: bool
    amount_usd_micros: int | None
    over_reservation_usd_micros: int

    @classmethod
    def from_json(cls, value: Any) -> ReservationSettlement | None:
        if not isinstance(value, dict):
            return None
        amount = value.get("amount_usd_micros")
        return cls(
            value.get("reservation_id", ""),
            bool(value.get("settled", False)),
            None if amount is None else int(amount),
            int(value.get("over_reservation_usd_micros", 0)),
        )


@dataclass(frozen=True)
class UsageReceipt:
    """``202`` answer to a usage report."""

    request_id: str
    status: str
    duplicate: bool
    shard_id: int | None
    cost_usd_micros: int | None
    quota: LabelQuota | None
    total: ScopeTotal | None = None
    reservation: ReservationSettlement | None = None  # the record carried ``reservation_id``
    selection: CarriedSelection | None = None  # asked for with the report
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict) -> UsageReceipt:
        processing = body.get("processing") or {}
        return cls(
            body.get("request_id", ""),
            body.get("status", "accepted"),
            bool(body.get("duplicate", False)),
            processing.get("shard_id"),
            processing.get("cost_usd_micros"),
            LabelQuota.find(body),
            ScopeTotal.from_json(body.get("scope_total")),
            ReservationSettlement.from_json(body.get("reservation")),
            CarriedSelection.find(body),
            body,
        )


@dataclass(frozen=True)
class BatchItemResult:
    """One record's outcome: accepted (shard, cost, replay or not) or failed (error code and message)."""

    request_id: str
    status: str
    error: str | None
    message: str | None
    shard_id: int | None
    cost_usd_micros: int | None
    duplicate: bool
    reservation: ReservationSettlement | None = None  # an accepted record that carried ``reservation_id``

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


@dataclass(frozen=True)
class BatchResult:
    """``207`` answer to a batch report: one result per record, and the quota position of
    each label the batch counted (``daily_totals``) and of the scope's total (``scope_total``),
    when the server includes them."""

    accepted: int
    failed: int
    results: tuple[BatchItemResult, ...]
    quotas: tuple[LabelQuota, ...] = ()
    total: ScopeTotal | None = None
    selection: CarriedSelection | None = None  # asked for with the batch
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict) -> BatchResult:
        results = tuple(
            BatchItemResult(
                item.get("request_id", ""),
                item.get("status", ""),
                item.get("error"),
                item.get("message"),
                item.get("shard_id"),
                item.get("cost_usd_micros"),
                bool(item.get("duplicate", False)),
                ReservationSettlement.from_json(item.get("reservation")),
            )
            for item in body.get("results") or ()
        )
        accepted = body.get("accepted", sum(item.accepted for item in results))
        quotas = tuple(
            LabelQuota.from_json(value) for value in body.get("daily_totals") or () if isinstance(value, dict)
        )
        return cls(
            int(accepted),
            int(body.get("failed", len(results) - accepted)),
            results,
            quotas,
            ScopeTotal.from_json(body.get("scope_total")),
            CarriedSelection.find(body),
            body,
        )


@dataclass(frozen=True)
class LabelSpend:
    label: str
    bedrock_model_id: str | None
    cost_usd_micros: int
    quota_usd_micros: int
    quota_pct: float
    quota_status: str
    input_tokens: int
    output_tokens: int
    requests: int
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    average_cost_per_request: int = 0
    reserved_usd_micros: int = 0  # held by live reservations (hard cap), beside the spend

    @classmethod
    def from_json(cls, label: str, body: dict) -> LabelSpend:
        return cls(
            label=body.get("label", label),
            bedrock_model_id=body.get("bedrock_model_id"),
            cost_usd_micros=int(body.get("cost_usd_micros", 0)),
            quota_usd_micros=int(body.get("quota_usd_micros") or 0),  # null: a label outside the orderings
            quota_pct=float(body.get("quota_pct") or 0),
            quota_status=body.get("quota_status", "NORMAL"),
            input_tokens=int(body.get("input_tokens", 0)),
            output_tokens=int(body.get("output_tokens", 0)),
            requests=int(body.get("requests", 0)),
            cache_read_input_tokens=int(body.get("cache_read_input_tokens", 0)),
            cache_write_input_tokens=int(body.get("cache_write_input_tokens", 0)),
            average_cost_per_request=int(body.get("average_cost_per_request", 0)),
            reserved_usd_micros=int(body.get("reserved_usd_micros", 0)),
        )


@dataclass(frozen=True)
class DailySpend:
    """``GET .../aggregates/{today|date}``: one org-local day's spend against quota, per label."""

    org_id: str
    app_id: str | None
    app_name: str | None
    date: str
    timezone: str | None
    quota_scope: str | None
    labels: tuple[LabelSpend, ...]
    total_cost_usd_micros: int
    total_quota_usd_micros: int
    total_quota_pct: float
    sticky_fallback_active: bool
    current_active_model: str | None
    updated_at: datetime | None
    raw: dict = field(repr=False, compare=False)
    total_reserved_usd_micros: int = 0
    models_omitted: int = 0  # labels outside the orderings left out of ``labels`` (their spend is in the total)

    @classmethod
    def from_json(cls, body: dict) -> DailySpend:
        labels = tuple(LabelSpend.from_json(label, item) for label, item in (body.get("models") or {}).items())
        return cls(
            org_id=body.get("org_id", ""),
            app_id=body.get("app_id"),
            app_name=body.get("app_name"),
            date=body.get("date", ""),
            timezone=body.get("timezone"),
            quota_scope=body.get("quota_scope"),
            labels=labels,
            total_cost_usd_micros=int(body.get("total_cost_usd_micros", sum(x.cost_usd_micros for x in labels))),
            total_quota_usd_micros=int(body.get("total_quota_usd_micros", sum(x.quota_usd_micros for x in labels))),
            total_quota_pct=float(body.get("total_quota_pct", 0)),
            sticky_fallback_active=bool(body.get("sticky_fallback_active", False)),
            current_active_model=body.get("current_active_model"),
            updated_at=_time(body.get("updated_at")),
            raw=body,
            total_reserved_usd_micros=int(body.get("total_reserved_usd_micros", 0)),
            models_omitted=int(body.get("models_omitted", 0)),
        )

    @property
    def total_requests(self) -> int:
        return sum(label.requests for label in self.labels)

    @property
    def mode(self) -> str:
        """The quota state of the model in use: NORMAL, TIGHT, or EXCEEDED once every label is spent."""
        statuses = {label.label: label.quota_status for label in self.labels}
        if self.current_active_model in statuses:
            return statuses[self.current_active_model]
        open_labels = [status for status in statuses.values() if status != "EXCEEDED"]
        return open_labels[0] if open_labels else ("EXCEEDED" if statuses else "NORMAL")

    def to_json(self) -> dict:
        body = {name: value for name, value in asdict(self).items() if name != "raw"}
        body["labels"] = list(body["labels"])
        body["updated_at"] = iso_utc(self.updated_at) if self.updated_at else None
        body["mode"] = self.mode
        body["total_requests"] = self.total_requests
        return body


@dataclass(frozen=True)
class Credentials:
    client_id: str
    client_secret: str = field(repr=False)


@dataclass(frozen=True)
class Provisioned:
    """Answer to ``PUT .../orgs/{org_id}`` or ``PUT .../apps/{app_id}``; ``credentials`` and
    ``created_at`` on creation, ``updated_at`` on an update."""

    org_id: str
    app_id: str | None
    status: str
    credentials: Credentials | None
    configuration: dict
    created_at: datetime | None
    updated_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @property
    def created(self) -> bool:
        return self.status == "created"

    @classmethod
    def from_json(cls, body: dict) -> Provisioned:
        creds = body.get("credentials")
        return cls(
            body.get("org_id", ""),
            body.get("app_id"),
            body.get("status", ""),
            Credentials(creds["client_id"], creds["client_secret"]) if creds else None,
            body.get("configuration") or {},
            _time(body.get("created_at")),
            _time(body.get("updated_at")),
            body,
        )


@dataclass(frozen=True)
class Rotation:
    """Answer to ``POST .../credentials/rotate``: the new secret, and until when the old one works."""

    org_id: str
    app_id: str | None
    credentials: Credentials
    rotated_at: datetime | None
    old_secret_expires_at: datetime | None
    grace_period_hours: int
    raw: dict = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict) -> Rotation:
        rotation = body.get("rotation") or {}
        return cls(
            body.get("org_id", ""),
            body.get("app_id"),
            Credentials(body["client_id"], body["client_secret"]),
            _time(rotation.get("rotated_at")),
            _time(rotation.get("old_secret_expires_at")),
            int(rotation.get("grace_period_hours", 0)),
            body,
        )
