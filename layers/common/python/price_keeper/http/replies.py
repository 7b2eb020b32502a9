"""The reply bodies of the main endpoints, as pydantic models: the handlers answer through
them (``api.reply``) and the OpenAPI document publishes them, so the document, typed
clients generated from it and the wire cannot drift apart."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ..validation import Schema


class Reply(Schema):
    """Base of reply bodies: a field the model does not declare is an error (a 500 in the
    handler, a failing test), never silently published or dropped."""

    model_config = ConfigDict(extra="forbid")


Status = Literal["NORMAL", "TIGHT", "EXCEEDED"]
Mode = Literal["NORMAL", "TIGHT"]
PriceSource = Literal["PRICING_API", "CONFIG_FALLBACK", "ESTIMATE", "UNAVAILABLE"]
ProfileKind = Literal["IN_REGION", "GEOGRAPHIC", "GLOBAL"]


class Processing(Reply):
    shard_id: int
    expected_aggregation_lag_secs: int
    cost_usd_micros: int = Field(description="Server-computed cost of the call")


class UsagePricing(Reply):
    source: PriceSource
    version: str = Field(description="The price day, YYYY-MM-DD")
    profile_kind: ProfileKind


class DailyStatus(Reply):
    """A label's DailyTotal as of the last aggregation, against its quota."""

    label: str
    org_day: str = Field(description="yyyymmdd")
    cost_usd_micros: int
    requests: int
    quota_usd_micros: int
    quota_pct: float | None
    status: Status | None = Field(description="null for a label without a quota")
    mode: Mode
    aggregated_at: str | None


class ScopeTotal(Reply):
    """The scope's spend of today over every label, as of the last aggregation, against its
    total daily cap: a usage reply's sign that the cap is near (TIGHT) or passed (EXCEEDED)."""

    org_day: str = Field(description="yyyymmdd: today in the org's timezone")
    spend_usd_micros: int
    quota_usd_micros: int = Field(description="The total cap (total_quota_usd_micros, or the sum of the quotas)")
    quota_pct: float | None
    status: Status


class ReservationSettlement(Reply):
    """How a usage record carrying ``reservation_id`` settled it."""

    reservation_id: str
    settled: bool = Field(description="This record ended the live hold (False: already ended, or a duplicate)")
    amount_usd_micros: int | None = Field(description="The hold this record settled")
    over_reservation_usd_micros: int = Field(description="Actual cost above the hold (counted, and flagged)")


class Reservation(Reply):
    """201 of POST .../reservations."""

    reservation_id: str
    label: str
    bedrock_model_id: str | None
    amount_usd_micros: int = Field(description="The call's worst-case cost, held until settled or expired")
    expires_at: str


class UsageReceipt(Reply):
    """202 of POST .../usage."""

    request_id: str
    status: Literal["accepted"]
    message: str
    duplicate: bool = Field(description="True when this request_id was counted before (not counted again)")
    processing: Processing
    pricing: UsagePricing
    timestamp: str
    daily_total: DailyStatus
    scope_total: ScopeTotal
    reservation: ReservationSettlement | None = None


class BatchResult(Reply):
    request_id: str | None
    status: Literal["accepted", "failed"]
    shard_id: int | None = None
    cost_usd_micros: int | None = None
    duplicate: bool | None = None
    error: str | None = Field(None, description="The error code of a failed record")
    message: str | None = None
    reservation: ReservationSettlement | None = Field(
        None, description="An accepted record carrying reservation_id: how it settled (as in UsageReceipt)"
    )


class BatchReceipt(Reply):
    """207 of POST .../usage/batch: one result per record, in order."""

    accepted: int
    failed: int
    results: list[BatchResult]
    daily_totals: list[DailyStatus] = Field(description="The quota position of each label the batch counted")
    scope_total: ScopeTotal
    timestamp: str


class Recommendation(Reply):
    label: str
    bedrock_model_id: str | None
    reason: str
    description: str


class ModelStatus(Reply):
    spend_usd_micros: int
    reserved_usd_micros: int = Field(0, description="Held by live reservations (hard cap), beside spend")
    quota_usd_micros: int
    quota_pct: float | None
    status: Status


class TotalStatus(Reply):
    """The scope's spend over every label against its total daily cap."""

    spend_usd_micros: int
    reserved_usd_micros: int = Field(0, description="Held by live reservations (hard cap), beside spend")
    quota_usd_micros: int
    quota_pct: float | None
    exceeded: bool


class QuotaStatus(Reply):
    scope: Literal["ORG", "APP"]
    mode: Mode
    current_model: str
    spend_usd_micros: int
    reserved_usd_micros: int = Field(0, description="Held by live reservations (hard cap), beside spend")
    quota_usd_micros: int
    quota_pct: float | None
    sticky_fallback_active: bool
    models_status: dict[str, ModelStatus]
    total: TotalStatus
    app_total: TotalStatus | None = Field(
        None, description="ORG scope, an app with a daily cap (app_daily_cap_usd_micros): its own spend against it"
    )


class SelectionPricing(Reply):
    """The chosen label's prices of the day (``source: UNAVAILABLE`` and no prices when it
    cannot be priced right now)."""

    version: str
    source: PriceSource
    profile_kind: ProfileKind | None = None
    input_price_usd_micros_per_1m: int | None = None
    output_price_usd_micros_per_1m: int | None = None
    cache_read_price_usd_micros_per_1m: int | None = None
    cache_write_price_usd_micros_per_1m: int | None = None


class ClientGuidance(Reply):
    check_frequency: str
    cache_duration_secs: int
    explanation: str


class ModelSelection(Reply):
    """200 of GET .../model-selection."""

    org_id: str
    app_id: str
    recommended_model: Recommendation
    quota_status: QuotaStatus
    pricing: SelectionPricing
    client_guidance: ClientGuidance
    checked_at: str
    org_day: str
    org_local_time: str


class ModelAggregate(Reply):
    label: str
    bedrock_model_id: str | None
    cost_usd_micros: int
    reserved_usd_micros: int = Field(0, description="Held by live reservations (hard cap), beside spend")
    quota_usd_micros: int
    quota_pct: float | None
    quota_status: Status
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_write_input_tokens: int
    requests: int
    average_cost_per_request: int


class Aggregates(Reply):
    """200 of GET .../aggregates/today and .../aggregates/{date} (org or app)."""

    org_id: str
    app_id: str | None = None
    app_name: str | None = None
    date: str
    timezone: str
    quota_scope: Literal["ORG", "APP"]
    models: dict[str, ModelAggregate]
    total_cost_usd_micros: int
    total_reserved_usd_micros: int = Field(0, description="Held by live reservations of the scope")
    total_quota_usd_micros: int
    total_quota_pct: float | None
    sticky_fallback_active: bool
    current_active_model: str | None
    updated_at: str | None


class Tokens(Reply):
    """200 of POST /auth/token and /auth/refresh."""

    access_token: str
    refresh_token: str
    token_type: Literal["Bearer"]
    expires_in: int = Field(description="Seconds the access token is valid")
    refresh_expires_in: int = Field(description="Seconds the refresh token is valid")
    scope: str


class RefreshedToken(Reply):
    """200 of POST /auth/refresh: a new access token (the refresh token stays as it was)."""

    access_token: str
    token_type: Literal["Bearer"]
    expires_in: int


class ReconciledSide(Reply):
    invocations: int
    input_tokens: int
    output_tokens: int


class Unmetered(Reply):
    input_tokens: int = Field(description="Bedrock's input tokens beyond the metered ones")
    output_tokens: int = Field(description="Bedrock's output tokens beyond the metered ones")
    estimated_cost_usd_micros: int = Field(
        description="The unmetered tokens (cache tokens included) at the model's price of the day"
    )


class ReconciledModel(Reply):
    model_id: str = Field(description="The model, system profile id or application profile id Bedrock counted")
    bedrock: ReconciledSide = Field(description="CloudWatch AWS/Bedrock counts of calls made that day")
    metered: ReconciledSide = Field(description="What was reported for the same model (docs/metering.md)")
    unmetered: Unmetered


class Reconciliation(Reply):
    """``GET /api/v1/reconciliation``: a UTC day's latest reconciliation in the service's Region."""

    date: str = Field(description="The UTC day, YYYY-MM-DD")
    region: str
    models: list[ReconciledModel]
