"""Typed exceptions for every error code of the Price Keeper API.

Each server error becomes an instance of the class registered for its ``error`` code
(``QUOTA_EXCEEDED`` -> :class:`QuotaExceeded`, ...), carrying the HTTP status, the
message, the ``details`` object and the ``request_id`` of the error body. Bodies without
a known code (a proxy's HTML page, API Gateway's own ``{"message": ...}``) fall back to
the class for their HTTP status, so callers can always catch by meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

ERRORS_BY_CODE: dict[str, type[PriceKeeperError]] = {}  # every error code of the API -> its class


class PriceKeeperError(Exception):
    """Base of every error the client raises for an answer from the service."""

    code = "ERROR"
    status = 0
    retryable = False

    def __init_subclass__(cls, *, code: str | None = None, status: int = 0, retryable: bool = False, **kwargs):
        """``class NotFound(PriceKeeperError, code="NOT_FOUND", status=404)``: the class of an
        error code, registered in ``ERRORS_BY_CODE`` when the service answers with it (a status)."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code, cls.status, cls.retryable = code, status, retryable
            if status:
                ERRORS_BY_CODE[code] = cls

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        retry_after_seconds: float | None = None,
        body: Mapping[str, Any] | None = None,
    ):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.details = dict(details or {})
        self.request_id = request_id
        self.retry_after_seconds = retry_after_seconds
        self.body = dict(body or {})

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.message}" if self.status else f"{self.code}: {self.message}"


class ConnectionFailed(PriceKeeperError, code="CONNECTION_FAILED", retryable=True):
    """The service could not be reached or did not answer in time (no HTTP status)."""


class InvalidRequest(PriceKeeperError, code="INVALID_REQUEST", status=400): ...


class InvalidConfig(PriceKeeperError, code="INVALID_CONFIG", status=400): ...


class InvalidModelLabel(PriceKeeperError, code="INVALID_MODEL_LABEL", status=400): ...


class Unauthorized(PriceKeeperError, code="UNAUTHORIZED", status=401): ...


class Forbidden(PriceKeeperError, code="FORBIDDEN", status=403): ...


class NotFound(PriceKeeperError, code="NOT_FOUND", status=404): ...


class AlreadyExists(PriceKeeperError, code="ALREADY_EXISTS", status=409): ...


class QuotaExceeded(PriceKeeperError, code="QUOTA_EXCEEDED", status=429):
    """Every model's daily quota is spent; ``retry_after`` is when the org's next day starts (UTC)."""

    def __init__(self, message: str, *, retry_after: datetime | None = None, **kwargs):
        super().__init__(message, **kwargs)
        if retry_after is None and self.retry_after_seconds is not None:
            retry_after = datetime.now(UTC) + timedelta(seconds=self.retry_after_seconds)
        self.retry_after = retry_after


class RateLimitExceeded(PriceKeeperError, code="RATE_LIMIT_EXCEEDED", status=429, retryable=True): ...


class InternalError(PriceKeeperError, code="INTERNAL_ERROR", status=500, retryable=True): ...


class ServiceUnavailable(PriceKeeperError, code="SERVICE_UNAVAILABLE", status=503, retryable=True): ...


_ERRORS_BY_STATUS: dict[int, type[PriceKeeperError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: AlreadyExists,
    429: RateLimitExceeded,
    500: InternalError,
    503: ServiceUnavailable,
}


def parse_timestamp(value: str) -> datetime:
    """An ISO 8601 time (``...Z`` or with an offset) as an aware UTC datetime."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def error_from_response(status: int, body: Any, headers: Mapping[str, str]) -> PriceKeeperError:
    """The typed exception for an error answer (``body`` is the decoded JSON, or None)."""
    body = body if isinstance(body, dict) else {}
    code = body.get("error") if isinstance(body.get("error"), str) else None
    cls = ERRORS_BY_CODE.get(code) or _ERRORS_BY_STATUS.get(status)
    if cls is None:
        cls = InternalError if status >= 500 else PriceKeeperError
    message = body.get("message") if isinstance(body.get("message"), str) else f"HTTP {status}"
    details = body.get("details") if isinstance(body.get("details"), dict) else None
    request_id = body.get("request_id") or headers.get("x-amzn-requestid") or headers.get("x-request-id")
    retry_after_seconds = _seconds(headers.get("retry-after"))
    raw_retry_after = body.get("retry_after")
    if retry_after_seconds is None:
        retry_after_seconds = _seconds(raw_retry_after)
    kwargs: dict[str, Any] = dict(
        status=status,
        code=code or cls.code,
        details=details,
        request_id=request_id,
        retry_after_seconds=retry_after_seconds,
        body=body,
    )
    if cls is QuotaExceeded and isinstance(raw_retry_after, str):
        try:
            kwargs["retry_after"] = parse_timestamp(raw_retry_after)
        except ValueError:
            pass
    return cls(message, **kwargs)
