"""The error schema of ``api_spec.md``: every 4xx/5xx body is built here, and every
failure becomes the client's error in one place (``as_api_error``)."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from .observability import logger
from .timeutil import iso_utc, utc_now

# AWS error codes that mean "try again" (answered as a 503 with Retry-After).
RETRYABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "TransactionConflictException",
        # the SDK sent a slow transaction again under its ClientRequestToken while the first
        # was still being applied: a later retry gets the first one's outcome
        "TransactionInProgressException",
    }
)


class ApiError(Exception):
    """An error answered to the client as ``{"error", "message", "details", ...}``.

    ``extra`` adds top-level fields the spec puts beside the standard ones
    (``retry_after`` on 429s, ``hint`` on 404s).
    """

    def __init__(
        self, status: int, code: str, message: str, details: dict | None = None, headers: dict | None = None, **extra
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}
        self.extra = extra

    def body(self, request_id: str | None = None) -> dict:
        return error_body(self.code, self.message, self.details, request_id, **self.extra)


def error_body(code: str, message: str, details: dict | None = None, request_id: str | None = None, **extra) -> dict:
    body = {"error": code, "message": message}
    if details:
        body["details"] = details
    body.update(extra)
    body["timestamp"] = iso_utc(utc_now())
    if request_id:
        body["request_id"] = request_id
    return body


# An unknown body key is echoed in ``loc``: cut it short (it may be a whole form-encoded body).
LOC_PART_MAX_CHARS = 64


def validation_details(errors) -> list[dict]:
    """Pydantic errors reduced to JSON-safe ``{"loc", "msg", "type"}`` (never echoing input)."""
    return [
        {
            "loc": [str(part)[:LOC_PART_MAX_CHARS] for part in err.get("loc", ())],
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in errors
    ]


def invalid_request(message: str, **details) -> ApiError:
    return ApiError(400, "INVALID_REQUEST", message, details or None)


def invalid_config(message: str, **details) -> ApiError:
    return ApiError(400, "INVALID_CONFIG", message, details or None)


def unauthorized(message: str = "Missing or invalid authentication") -> ApiError:
    return ApiError(401, "UNAUTHORIZED", message, headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str = "Token does not grant access to this resource") -> ApiError:
    return ApiError(403, "FORBIDDEN", message)


def not_found(message: str, **details) -> ApiError:
    return ApiError(404, "NOT_FOUND", message, details or None)


def service_unavailable(message: str = "Storage temporarily unavailable; retry", retry_after: int = 1) -> ApiError:
    return ApiError(
        503, "SERVICE_UNAVAILABLE", message, headers={"Retry-After": str(retry_after)}, retry_after=retry_after
    )


def error_code(error: ClientError | BotoCoreError) -> str:
    """The AWS error code of a failed call (``Unreachable`` when the service never answered)."""
    return error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else "Unreachable"


def is_retryable(error: ClientError | BotoCoreError) -> bool:
    """A throttled, busy or unreachable service: the same request may succeed later."""
    return isinstance(error, BotoCoreError) or error_code(error) in RETRYABLE_CODES


def as_api_error(error: Exception) -> ApiError:
    """Any exception as the error the client gets: a throttled or unreachable store is a
    retryable 503, anything unexpected a logged 500 (the one mapping of the service)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, (ClientError, BotoCoreError)):
        if is_retryable(error):
            logger.warning("storage throttled or unreachable", extra={"aws_error": error_code(error)})
            return service_unavailable()
        logger.exception("unexpected storage error", extra={"aws_error": error_code(error)})
    else:
        logger.exception("unhandled error")
    return ApiError(500, "INTERNAL_ERROR", "Internal error")
