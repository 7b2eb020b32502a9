"""The reply body of every endpoint, as pydantic models: the handlers answer through them
(``api.reply``; the OAuth2 forms through ``published``) and the OpenAPI document publishes
them, so the document, typed clients generated from it and the wire cannot drift apart.
A 204 has no body and no model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from ..validation import Schema


class Reply(Schema):
    """Base of reply bodies: a field the model does not declare is an error (a 500 in the
    handler, a failing test), never silently published or dropped."""

    model_config = ConfigDict(extra="forbid")


def published(model: type[Reply], body: dict) -> dict:
    """``body`` as ``model`` publishes it: validated (a body that breaks its schema is a bug,
    answered 500), with exactly the fields it has (a field left out stays out)."""
    return model.model_validate(body).model_dump(mode="json", exclude_unset=True)


Status = Literal["NORMAL", "TIGHT", "EXCEEDED"]
Mode = Literal["NORMAL", "TIGHT"]
PriceSource = Literal["PRICING_API", "CONFIG_FALLBACK", "ESTIMATE", "RESERVED", "UNAVAILABLE"]
ProfileKind = Literal["IN_REGION", "GEOGRAPHIC", "GLOBAL"]


class Processing(Reply):
    shard_id: int
    expected_aggregation_lag_secs: int
    cost_usd_micros: int = Field(description="Server-computed cost of the call")


class Rates(Reply):
    """The prices a record was counted at, micro-USD per 1M tokens."""

    input_price_usd_micros_per_1m: int
    output_price_usd_micros_per_1m: int
    cache_read_price_usd_micros_per_1m: int
    cache_write_price_usd_micros_per_1m: int = Field(description="A cache write with the 5-minute TTL")
    cache_write_1h_price_usd_micros_per_1m: int = Field(description="A cache write with the 1-hour TTL")


class UsagePricing(Reply):
    """Which rates applied to the record (docs/metering.md, "What a call costs")."""

    source: PriceSource = Field(description="RESERVED: a reserved-tier call, prepaid (0 marginal cost)")
    version: str = Field(description="The price day, YYYY-MM-DD")
    profile_kind: ProfileKind
    service_tier: Literal["default", "priority", "flex", "reserved"] | None = None
    latency_optimized: bool | None = None
    inference_type: Literal["ON_DEMAND", "BATCH"] | None = None
    long_context: bool | None = Field(None, description="Priced at the model's long-context rate")
    rates: Rates | None = Field(None, description="Left out of a duplicate's answer")


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
    model_selection: CarriedSelection = None


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
    model_selection: CarriedSelection = None


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


# What a usage answer (single or batch) carries when the report asked for it.
CarriedSelection = Annotated[
    ModelSelection | None,
    Field(
        description="Only when asked (?model_selection=true): the selection GET .../model-selection answers now; "
        "null when every label is spent (that endpoint answers 429 QUOTA_EXCEEDED with the details); "
        "left out when the store was too busy to read it (the usage is counted)"
    ),
]


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
    models_omitted: int = Field(
        0,
        description="Labels with spend outside the orderings that models leaves out (past 1,000 app x label keys); "
        "their spend is in total_cost_usd_micros",
    )


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
    models: list[ReconciledModel] = Field(description="This page's models (500 a page, by model id)")
    page: int = Field(description="Which page of the day's models this is, from 0")
    pages: int = Field(description="How many pages the day's models take (0: nothing reconciled)")


# --- service ------------------------------------------------------------------------------


class ServiceEndpoints(Reply):
    authentication: str
    health: str
    api: str


class ServiceInfo(Reply):
    """200 of GET /."""

    service: str
    version: str
    description: str
    documentation: str
    endpoints: ServiceEndpoints


class Database(Reply):
    status: Literal["connected", "disconnected"]
    latency_ms: int | None = Field(None, description="connected: the probe's round trip")
    error: str | None = Field(None, description="disconnected: the kind of failure")


class Health(Reply):
    """200 (healthy) and 503 (unhealthy: the store does not answer) of GET /health."""

    status: Literal["healthy", "unhealthy"]
    service: str
    version: str
    timestamp: str
    database: Database


class Revoked(Reply):
    """200 of POST /auth/revoke as an OAuth2 form (RFC 7009): an empty object."""


# --- provisioning and credentials -----------------------------------------------------------


class ClientCredentials(Reply):
    client_id: str
    client_secret: str = Field(description="Shown only here: store it securely")


class OrgConfiguration(Reply):
    timezone: str
    quota_scope: Literal["ORG", "APP"]
    model_ordering: list[str]
    agg_shard_count: int
    total_quota_usd_micros: int = Field(description="The total daily cap in force (set, or the sum of the quotas)")
    ignored_app_quota_overrides: list[str] | None = Field(
        None, description="An update of an ORG-scoped org: apps whose own quotas (set under APP scope) are ignored"
    )


class OrgCreated(Reply):
    """201 of PUT /api/v1/orgs/{org_id}: the org's client credentials, shown only here."""

    org_id: str
    status: Literal["created"]
    created_at: str
    credentials: ClientCredentials
    configuration: OrgConfiguration


class OrgUpdated(Reply):
    """200 of PUT /api/v1/orgs/{org_id}."""

    org_id: str
    status: Literal["updated"]
    updated_at: str
    configuration: OrgConfiguration


class AppConfiguration(Reply):
    app_name: str
    model_ordering: list[str] = Field(description="The app's own, or its org's")
    inherited_fields: list[str] = Field(description="Settings the app takes from its org")


class AppCreated(Reply):
    """201 of PUT .../apps/{app_id}: the app's client credentials, shown only here."""

    org_id: str
    app_id: str
    status: Literal["created"]
    created_at: str
    credentials: ClientCredentials
    configuration: AppConfiguration


class AppUpdated(Reply):
    """200 of PUT .../apps/{app_id}."""

    org_id: str
    app_id: str
    status: Literal["updated"]
    updated_at: str
    configuration: AppConfiguration


class RotationWindow(Reply):
    rotated_at: str
    old_secret_expires_at: str = Field(description="Until then the old secret obtains tokens too")
    grace_period_hours: int


class RotatedCredentials(Reply):
    """200 of POST .../credentials/rotate (org or app): the new secret, shown only here."""

    org_id: str
    app_id: str | None = Field(None, description="An app's rotation only")
    client_id: str
    client_secret: str
    rotation: RotationWindow


class Boost(Reply):
    """201 of POST .../quota-boosts: the stored boost."""

    boost_id: str
    org_id: str
    app_id: str | None
    model_label: str
    amount_usd_micros: int
    expires_at: str = Field(description="UTC, e.g. 2026-01-24T18:00:00Z")
    created_at: str


class VoidResult(Reply):
    request_id: str
    status: Literal["voided", "already_voided", "not_found"]
    model_label: str | None = None
    org_day: str | None = Field(None, description="yyyymmdd the record was counted toward")
    cost_usd_micros: int | None = Field(None, description="What the record counted (taken back when voided now)")


class VoidReply(Reply):
    """200 of POST .../usage/void: one result per request id."""

    org_id: str
    app_id: str
    voided: int = Field(description="Records this request voided")
    voided_cost_usd_micros: int
    results: list[VoidResult]
    timestamp: str


# --- apps, reports and alerts ---------------------------------------------------------------


class ProfileRegistered(Reply):
    """201 of POST .../inference-profiles."""

    profile_label: str
    inference_profile_arn: str
    status: Literal["registered"]
    description: str | None = Field(None, description="When the request gave one")
    created_at: str


class SpendRow(Reply):
    date: str = Field(description="Org-local day, YYYY-MM-DD")
    app_id: str | None = Field(description="null in ORG-scoped orgs (spend is kept per org)")
    label: str
    cost_usd_micros: int
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_write_input_tokens: int
    requests: int


class SpendReport(Reply):
    """200 of GET .../reports/spend as JSON; ``format=csv`` has the same columns."""

    rows: list[SpendRow]


class AlertEntry(Reply):
    type: Literal["THRESHOLD", "FALLBACK", "ALL_EXHAUSTED", "UNPRICED_MODEL", "UNREPORTED_USAGE", "OVER_RESERVATION"]
    label: str | None = Field(description="null for ALL_EXHAUSTED, and for THRESHOLD of the scope's total cap")
    threshold_pct: int | None = Field(description="THRESHOLD only")
    model_id: str | None = Field(
        description="UNPRICED_MODEL: the Bedrock model counted at the estimate; "
        "UNREPORTED_USAGE: the model Bedrock counted beyond the metered usage"
    )
    scope: str = Field(description="Quota scope key: ORG#{org_id} or ORG#{org_id}#APP#{app_id}")
    app_id: str | None
    fired_at: str


class AlertList(Reply):
    """200 of GET .../alerts."""

    date: str = Field(description="The org-local day listed, YYYY-MM-DD")
    alerts: list[AlertEntry]
