"""Request bodies of the metering endpoints (pydantic: validated by the Powertools resolver
and published in the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from ..validation import APP_ID_PATTERN, REGION_PATTERN, StrictBody, is_uuid

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
