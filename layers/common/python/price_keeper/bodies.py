"""The request body of every endpoint that takes JSON: what the wire accepts, in one place
(pydantic, strict, unknown fields refused; validated by the Powertools resolver before any
rule runs, and the OpenAPI document's request schemas). The replies are ``http/replies.py``;
the OAuth2 form bodies are ``http/oauth.py``'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from . import ratelimit
from .validation import APP_ID_PATTERN, REGION_PATTERN, Credential, StrictBody, Token, TokenTypeHint, is_uuid

MAX_USD_MICROS = 2**63 - 1  # the spec's CostAmount is a 64-bit integer

# --- usage and reservations ------------------------------------------------------------

# Far above any real request (a 1M-token context is 10**6); keeps the integer maths and
# DynamoDB numbers in a sane range.
MAX_TOKENS = 10**10
MAX_BATCH = 100

TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS)]

# How a call was made, which selects its rates (docs/metering.md, "What a call costs").
ServiceTier = Annotated[
    Literal["default", "priority", "flex", "reserved"],
    Field(description="Bedrock's serviceTier.type of the call: priority costs more, flex less, reserved is prepaid"),
]
LatencyOptimized = Annotated[bool, Field(description="performanceConfig.latency = optimized")]
InferenceType = Annotated[
    Literal["ON_DEMAND", "BATCH"], Field(description="BATCH: a record of a batch inference job's output")
]


class CallDimensions(StrictBody):
    """The fields of a usage record or a reservation that say how the call was made."""

    service_tier: ServiceTier = "default"
    latency_optimized: LatencyOptimized = False
    inference_type: InferenceType = "ON_DEMAND"

    @model_validator(mode="after")
    def _one_way_of_calling(self):
        if self.inference_type == "BATCH" and (self.service_tier != "default" or self.latency_optimized):
            raise ValueError("a BATCH record takes no service_tier or latency_optimized")
        return self


class UsageRequest(CallDimensions):
    request_id: Annotated[
        str, Field(description="UUID of the Bedrock call; the idempotency key", min_length=36, max_length=36)
    ]
    model_label: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    bedrock_model_id: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    calling_region: Annotated[str | None, StringConstraints(pattern=REGION_PATTERN)] = None
    input_tokens: TokenCount
    output_tokens: TokenCount
    cache_read_input_tokens: TokenCount = 0
    cache_write_input_tokens: TokenCount = Field(0, description="Every cache write, the 1-hour ones included")
    cache_write_1h_input_tokens: TokenCount = Field(
        0, description="The part of cache_write_input_tokens written with the 1-hour TTL"
    )
    status: Literal["OK", "ERROR"]
    timestamp: Annotated[
        str, Field(description="ISO 8601 time of the call, e.g. 2026-01-23T15:30:45Z", min_length=16, max_length=40)
    ]
    reservation_id: Annotated[
        str | None, Field(description="Settles this reservation (hard cap), exactly once", max_length=80)
    ] = None

    @field_validator("request_id")
    @classmethod
    def _canonical_uuid(cls, value: str) -> str:
        if not isinstance(value, str) or not is_uuid(value.lower()):
            raise ValueError("request_id must be a UUID")
        return value.lower()  # one request, one dedup key, whatever the client's case

    @model_validator(mode="after")
    def _one_hour_writes_are_cache_writes(self):
        if self.cache_write_1h_input_tokens > self.cache_write_input_tokens:
            raise ValueError("cache_write_1h_input_tokens is part of cache_write_input_tokens: it cannot exceed it")
        return self


class UsageBatchRequest(StrictBody):
    # Items are validated one by one (a bad item fails alone, with its own error code).
    requests: Annotated[
        list[Any],
        Field(
            min_length=1, max_length=MAX_BATCH, description="1-100 usage records, each shaped like a single usage body"
        ),
    ]


PROFILE_LABEL_MAX_LENGTH = 50  # api_spec.md: "Label to use for this profile (1-50 chars)"


class InferenceProfileRequest(StrictBody):
    profile_label: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN, max_length=PROFILE_LABEL_MAX_LENGTH)]
    inference_profile_arn: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    description: Annotated[str | None, StringConstraints(max_length=500)] = None


DEFAULT_TTL_SECS = 600


class ReservationRequest(CallDimensions):
    max_input_tokens: TokenCount = Field(description="Upper bound of the prompt's input tokens")
    max_output_tokens: TokenCount = Field(description="The call's maxTokens")
    max_cache_write_input_tokens: TokenCount = 0
    model_label: Annotated[str | None, StringConstraints(pattern=APP_ID_PATTERN, max_length=64)] = None
    ttl_secs: Annotated[int, Field(ge=10, le=3600)] = DEFAULT_TTL_SECS
    calling_region: Annotated[str | None, StringConstraints(pattern=REGION_PATTERN)] = Field(
        None, description="The Bedrock Region the call goes to, as its usage record will say: priced there"
    )


MAX_REQUEST_IDS = 100


class VoidRequest(StrictBody):
    app_id: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)] = Field(
        description="The app that reported the records"
    )
    request_ids: Annotated[list[str], Field(min_length=1, max_length=MAX_REQUEST_IDS)] = Field(
        description="The usage records' request_id values (UUIDs)"
    )
    reason: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)] = Field(
        description="Why they are voided (kept on each record and in the audit line)"
    )

    @field_validator("request_ids")
    @classmethod
    def _canonical_uuids(cls, values: list[str]) -> list[str]:
        if not all(is_uuid(value.lower()) for value in values):
            raise ValueError("every request_id must be a UUID")
        return list(dict.fromkeys(value.lower() for value in values))  # as usage stores them, once each


# --- quota boosts ----------------------------------------------------------------------


class BoostRequest(StrictBody):
    model_label: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)]
    amount_usd_micros: Annotated[int, Field(gt=0, le=MAX_USD_MICROS)]
    expires_at: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="ISO 8601 time with a UTC offset, in the future and at most 7 days ahead"
    )
    app_id: Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)] | None = Field(
        None, description="Required when the org's quota_scope is APP; not allowed when it is ORG"
    )


# --- provisioning ----------------------------------------------------------------------

MAX_LABELS = 32
MAX_GRACE_HOURS = 168
# Settings that only an org has: an app always takes them from its org.
ORG_ONLY_SETTINGS = frozenset({"timezone", "quota_scope", "agg_shard_count", "sticky_fallback_enabled"})

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Ordering = Annotated[list[Label], Field(min_length=1, max_length=MAX_LABELS)]
QuotaAmount = Annotated[int, Field(ge=0, le=MAX_USD_MICROS)]
Quotas = Annotated[dict[Label, QuotaAmount], Field(max_length=MAX_LABELS)]
TOTAL_QUOTA_DESCRIPTION = (
    "Daily cap over every label, in the ordering or not, in micro-USD; default: the sum of the ordering's label quotas"
)
APP_CAP_DESCRIPTION = (
    "ORG scope: the most one app may spend a day over every label, in micro-USD (model selection answers "
    "429 to that app once it is reached); default: no cap of its own"
)
ThresholdPct = Annotated[int, Field(ge=50, le=100)]
AlertThresholds = Annotated[list[Annotated[int, Field(ge=1, le=100)]], Field(min_length=1, max_length=10)]
RefreshSecs = Annotated[int, Field(ge=1, le=86_400)]  # at most a day
RateLimits = Annotated[
    dict[str, Annotated[int, Field(ge=1, le=ratelimit.MAX_ORG_REQUESTS)]],
    Field(min_length=1, max_length=len(ratelimit.ORG_ADJUSTABLE)),
]


class OrgOverrides(StrictBody):
    tight_mode_threshold_pct: ThresholdPct | None = None
    agg_shard_count: Literal[8, 16, 32, 64] | None = None
    sticky_fallback_enabled: bool | None = None
    refresh_interval_secs: RefreshSecs | None = Field(
        None, description="Stored as refresh_interval_normal_secs; the tight-mode interval stays the default"
    )
    alert_thresholds_pct: AlertThresholds | None = Field(
        None, description="THRESHOLD alert percentages of the org's quotas; default config.yaml alerts.thresholds_pct"
    )
    rate_limits: RateLimits | None = Field(
        None,
        description="Requests per window of each of the org's clients, by limit name "
        f"({', '.join(sorted(ratelimit.ORG_ADJUSTABLE))}); the window and the others stay config.yaml's",
    )

    @model_validator(mode="after")
    def _known_limits(self):
        unknown = sorted(set(self.rate_limits or ()) - ratelimit.ORG_ADJUSTABLE)
        if unknown:
            raise ValueError(f"rate_limits: {', '.join(unknown)} not among {sorted(ratelimit.ORG_ADJUSTABLE)}")
        return self


class OrgRequest(StrictBody):
    org_name: Name
    timezone: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    quota_scope: Literal["ORG", "APP"]
    model_ordering: Ordering
    quotas: Quotas = Field(description="Daily quota per label in micro-USD; one for every label in model_ordering")
    total_quota_usd_micros: QuotaAmount | None = Field(None, description=TOTAL_QUOTA_DESCRIPTION)
    app_daily_cap_usd_micros: QuotaAmount | None = Field(
        None, description=APP_CAP_DESCRIPTION + "; the default of every app of the org"
    )
    overrides: OrgOverrides = Field(default_factory=OrgOverrides)


def _reject_org_only(data):
    """A clear 400 for settings an app can never override (rather than "extra field")."""
    if isinstance(data, dict):
        fixed = sorted(ORG_ONLY_SETTINGS & data.keys())
        if fixed:
            raise ValueError(f"{', '.join(fixed)} always come(s) from the organization and cannot be set per app")
    return data


class AppOverrides(StrictBody):
    tight_mode_threshold_pct: ThresholdPct | None = None
    refresh_interval_secs: RefreshSecs | None = None

    _org_only = model_validator(mode="before")(_reject_org_only)


class AppRequest(StrictBody):
    app_name: Name
    model_ordering: Ordering | None = None
    quotas: Quotas | None = Field(None, description="Only when the org's quota_scope is APP")
    total_quota_usd_micros: QuotaAmount | None = Field(
        None, description=TOTAL_QUOTA_DESCRIPTION + "; only when the org's quota_scope is APP"
    )
    app_daily_cap_usd_micros: QuotaAmount | None = Field(
        None, description=APP_CAP_DESCRIPTION + "; default: the org's app_daily_cap_usd_micros"
    )
    overrides: AppOverrides = Field(default_factory=AppOverrides)

    _org_only = model_validator(mode="before")(_reject_org_only)


class RotateRequest(StrictBody):
    grace_period_hours: Annotated[int, Field(ge=0, le=MAX_GRACE_HOURS)] = MAX_GRACE_HOURS


class RevokeTokensRequest(StrictBody):
    """No fields: the body is ``{}`` (or absent); anything in it is a 400."""


# --- tokens (the JSON requests; the same as OAuth2 forms: http/oauth.py) -----------------


class TokenRequest(StrictBody):
    client_id: Credential
    client_secret: Credential
    grant_type: Literal["client_credentials"]


class RefreshRequest(StrictBody):
    refresh_token: Token
    grant_type: Literal["refresh_token"]


class RevokeRequest(StrictBody):
    token: Token
    token_type_hint: TokenTypeHint = None
