"""Every error code of api_spec.md becomes its typed exception, carrying what the body says."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import responses

from price_keeper_client import (
    AlreadyExists,
    ConnectionFailed,
    Forbidden,
    InternalError,
    InvalidConfig,
    InvalidModelLabel,
    InvalidRequest,
    NotFound,
    PriceKeeperError,
    Provisioning,
    QuotaExceeded,
    RateLimitExceeded,
    ServiceUnavailable,
    Unauthorized,
)
from price_keeper_client.transport import Transport

URL = "http://keeper.test"
SPEC_CODES = [
    (400, "INVALID_REQUEST", InvalidRequest),
    (400, "INVALID_CONFIG", InvalidConfig),
    (400, "INVALID_MODEL_LABEL", InvalidModelLabel),
    (401, "UNAUTHORIZED", Unauthorized),
    (403, "FORBIDDEN", Forbidden),
    (404, "NOT_FOUND", NotFound),
    (409, "ALREADY_EXISTS", AlreadyExists),
    (429, "QUOTA_EXCEEDED", QuotaExceeded),
    (429, "RATE_LIMIT_EXCEEDED", RateLimitExceeded),
    (500, "INTERNAL_ERROR", InternalError),
    (503, "SERVICE_UNAVAILABLE", ServiceUnavailable),
]


@pytest.mark.parametrize("status,code,cls", SPEC_CODES, ids=[code for _, code, _ in SPEC_CODES])
@responses.activate
def test_each_error_code_maps_to_its_exception(status, code, cls):
    request_id = str(uuid.uuid4())
    responses.get(
        f"{URL}/thing",
        status=status,
        json={
            "error": code,
            "message": f"{code} happened",
            "details": {"field": "value"},
            "timestamp": "2026-01-23T15:30:45Z",
            "request_id": request_id,
        },
    )
    with pytest.raises(cls) as caught:
        Transport(URL).request("GET", "/thing")
    error = caught.value
    assert isinstance(error, PriceKeeperError)
    assert (error.status, error.code, error.message) == (status, code, f"{code} happened")
    assert error.details == {"field": "value"}
    assert error.request_id == request_id
    assert error.retryable == (code in ("RATE_LIMIT_EXCEEDED", "INTERNAL_ERROR", "SERVICE_UNAVAILABLE"))


@responses.activate
def test_quota_exceeded_carries_retry_after_as_utc_datetime():
    responses.get(
        f"{URL}/sel",
        status=429,
        headers={"Retry-After": "3600"},
        json={
            "error": "QUOTA_EXCEEDED",
            "message": "All model quotas exceeded for today",
            "retry_after": "2026-01-24T05:00:00Z",
            "timestamp": "2026-01-23T15:30:45Z",
        },
    )
    with pytest.raises(QuotaExceeded) as caught:
        Transport(URL).request("GET", "/sel")
    assert caught.value.retry_after == datetime(2026, 1, 24, 5, 0, tzinfo=UTC)
    assert caught.value.retry_after_seconds == 3600


@responses.activate
def test_rate_limit_retry_after_seconds_from_body_when_no_header():
    responses.get(
        f"{URL}/x",
        status=429,
        json={
            "error": "RATE_LIMIT_EXCEEDED",
            "message": "slow down",
            "retry_after": 17,
            "timestamp": "2026-01-23T15:30:45Z",
        },
    )
    with pytest.raises(RateLimitExceeded) as caught:
        Transport(URL).request("GET", "/x")
    assert caught.value.retry_after_seconds == 17


@pytest.mark.parametrize(
    "status,body,cls",
    [
        (429, {"message": "Too Many Requests"}, RateLimitExceeded),  # API Gateway throttling
        (403, {"message": "Missing Authentication Token"}, Forbidden),  # API Gateway unknown route
        (502, None, InternalError),
        (504, None, InternalError),
        (503, None, ServiceUnavailable),
    ],
)
@responses.activate
def test_bodies_without_a_code_fall_back_to_the_status(status, body, cls):
    if body is None:
        responses.get(f"{URL}/x", status=status, body="<html>Bad gateway</html>")
    else:
        responses.get(f"{URL}/x", status=status, json=body)
    with pytest.raises(cls) as caught:
        Transport(URL).request("GET", "/x")
    assert caught.value.status == status


def test_unreachable_service_is_connection_failed():
    with pytest.raises(ConnectionFailed) as caught:
        Transport("http://127.0.0.1:9", timeout=2).request("GET", "/health")
    assert caught.value.retryable


@responses.activate
def test_provisioning_sends_the_api_key_and_never_shows_the_secret_in_repr():
    org_id = str(uuid.uuid4())
    responses.put(
        f"{URL}/api/v1/orgs/{org_id}",
        status=201,
        json={
            "org_id": org_id,
            "status": "created",
            "credentials": {"client_id": f"org-{org_id}", "client_secret": "s3cr3t"},
            "configuration": {"timezone": "UTC"},
        },
        match=[responses.matchers.header_matcher({"X-API-Key": "admin-key"})],
    )
    result = Provisioning(URL, "admin-key").put_org(org_id, {"org_name": "x"})
    assert result.created and result.credentials.client_secret == "s3cr3t"
    assert "s3cr3t" not in repr(result) and "admin-key" not in repr(Provisioning(URL, "admin-key"))
