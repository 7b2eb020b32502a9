"""HTTP glue shared by every handler: the Powertools resolver, the error schema, responses.

Every failure leaves through ``_error_response`` in the ``api_spec.md`` error schema:
validation problems are 400 ``INVALID_REQUEST`` (never Powertools' default 422), a store
that is throttled or unreachable is a retryable 503, and anything unexpected is a logged 500.
Every body is JSON, but for the OAuth2 forms of the token endpoints, which ``oauth.py``
answers (with the error codes of RFC 6749).

The same functions serve either gateway the stack deploys (``-c apiKind``): HTTP API
events (payload format 2.0) and REST API events (1.0), each read by Powertools' own data
class for it (``gateway_event``).
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, APIGatewayRestResolver, CORSConfig, Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType, RequestValidationError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent, APIGatewayProxyEventV2
from pydantic import BaseModel

from .. import audit, ratelimit, routes
from ..errors import ApiError, as_api_error, error_body, invalid_request, validation_details
from ..observability import logger, metrics, tracer
from . import oauth, pipeline, replies


def _json_default(value: Any):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(body: Any) -> str:
    return json.dumps(body, default=_json_default, separators=(",", ":"))


def json_response(status: int, body: Any, headers: dict | None = None) -> Response:
    return Response(status_code=status, content_type="application/json", body=dumps(body), headers=headers or {})


def reply(status: int, model: type[replies.Reply], body: dict, headers: dict | None = None) -> Response:
    """``body`` answered as ``model`` publishes it (``replies.published``)."""
    return json_response(status, replies.published(model, body), headers)


def documented(status: int, model: type[BaseModel], description: str) -> dict:
    """The ``responses`` of a route decorator declaring its reply model for the OpenAPI
    document (``|`` joins those of a route with several statuses)."""
    return {status: {"description": description, "content": {"application/json": {"model": model}}}}


def is_http_api(event: dict) -> bool:
    """Whether ``event`` is an HTTP API event (payload format 2.0) rather than a REST API one."""
    return event.get("version") == "2.0"


def gateway_event(event: dict) -> APIGatewayProxyEvent | APIGatewayProxyEventV2:
    """``event`` as Powertools reads its payload format."""
    return APIGatewayProxyEventV2(event) if is_http_api(event) else APIGatewayProxyEvent(event)


class GatewayResolver(APIGatewayRestResolver):
    """Powertools' REST resolver reading each event with the data class of its payload
    format, so one function serves an HTTP API and a REST API alike: routing, headers and
    the response's shape (``multiValueHeaders`` or comma-joined ``headers``) follow the event."""

    def _to_proxy_event(self, event: dict):
        if is_http_api(event):
            return APIGatewayProxyEventV2(event, self._json_body_deserializer)
        return super()._to_proxy_event(event)

    def _get_base_path(self) -> str:
        kind = (
            APIGatewayHttpResolver if isinstance(self.current_event, APIGatewayProxyEventV2) else APIGatewayRestResolver
        )
        return kind._get_base_path(self)

    def base_path(self) -> str:
        """The stage prefix of the current request's URL (``/dev``; ``""`` behind a custom domain
        or the ``$default`` stage), as Powertools' Swagger handler finds it."""
        return self._get_base_path()


def _request_id(app: GatewayResolver) -> str | None:
    try:
        return app.current_event.request_context.request_id
    except (AttributeError, KeyError, TypeError):
        return None


def _error_response(app: GatewayResolver, error: ApiError) -> Response:
    return json_response(error.status, error.body(_request_id(app)), error.headers)


def _unique_members(pairs: list[tuple[str, Any]]) -> dict:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise invalid_request("Request body has a duplicate key")
    return members


def parse_body(text: str) -> dict:
    """A request body: one JSON object with unique keys, else 400 ``INVALID_REQUEST``.

    Replaces Powertools' ``json.loads``, with which an array body was validated as its first
    element, the last of two equal keys won, and deep nesting or a number of over 4,300
    digits was a 500.
    """
    try:
        body = json.loads(text, object_pairs_hook=_unique_members)
    except (ValueError, RecursionError):  # malformed JSON, too many digits, too deep
        raise invalid_request("Request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise invalid_request("Request body must be a JSON object")
    return body


# Request headers a browser may send cross-origin, and response headers its script may read.
CORS_HEADERS = ["Authorization", "Content-Type", "X-API-Key"]
CORS_EXPOSED_HEADERS = ["Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]


def cors_config() -> CORSConfig | None:
    """Powertools' CORS answer for the origins the stack allows (``-c corsOrigins``, given to
    every HTTP function as ``CORS_ORIGINS``); None while CORS is off. The gateway answers
    preflights deployed; these are the headers of every real answer, refusals included."""
    origins = [origin.strip() for origin in os.environ.get("CORS_ORIGINS", "").split(",") if origin.strip()]
    if not origins:
        return None
    return CORSConfig(
        allow_origin=origins[0],
        extra_origins=origins[1:],
        allow_headers=CORS_HEADERS,
        expose_headers=CORS_EXPOSED_HEADERS,
    )


def build_app(*routers: Router) -> GatewayResolver:
    # debug=False: POWERTOOLS_DEV would otherwise print whole events (client secrets included).
    app = GatewayResolver(cors=cors_config(), enable_validation=True, debug=False, json_body_deserializer=parse_body)
    for router in routers:
        app.include_router(router)

    @app.exception_handler(Exception)
    def _failed(error: Exception):
        return _error_response(app, as_api_error(error))

    @app.exception_handler(RequestValidationError)
    def _invalid(error: RequestValidationError):
        return _error_response(
            app,
            ApiError(
                400, "INVALID_REQUEST", "Request validation failed", {"errors": validation_details(error.errors())}
            ),
        )

    @app.exception_handler(RequestUnsupportedContentType)
    def _unsupported_body(_error: RequestUnsupportedContentType):
        return _error_response(app, ApiError(400, "INVALID_REQUEST", "Content-Type must be application/json"))

    @app.not_found
    def _not_found(_error):
        return _error_response(app, ApiError(404, "NOT_FOUND", "No such route"))

    return app


# Content types Powertools would parse as a form (a list per field; multipart raising
# before any middleware runs). Every body of this API is JSON, but the OAuth2 forms.
FORM_CONTENT_TYPES = ("multipart/", oauth.CONTENT_TYPE)


def _proxy_response(status: int, body: Any, headers: dict) -> dict:
    """A JSON response given without the resolver (refusals of the pipeline, OAuth2 forms)."""
    return {"statusCode": status, "body": dumps(body), "headers": {"Content-Type": "application/json", **headers}}


def _form_answer(route: routes.Route | None, request: APIGatewayProxyEvent | APIGatewayProxyEventV2) -> dict | None:
    """The whole answer to an OAuth2 form request to a token endpoint (``oauth.py``); a 400 for
    any other form; None for every other request (the pipeline and the resolver answer)."""
    content_types = [
        str(value).strip().lower()
        for name, value in (request.get("headers") or {}).items()
        if name.lower() == "content-type"
    ]
    if not any(content_type.startswith(FORM_CONTENT_TYPES) for content_type in content_types):
        return None
    if not (
        oauth.accepts(route) and all(content_type.startswith(oauth.CONTENT_TYPE) for content_type in content_types)
    ):
        raise invalid_request(
            "Content-Type must be application/json" + (f" or {oauth.CONTENT_TYPE}" if oauth.accepts(route) else "")
        )
    return _proxy_response(*oauth.answer(route, request, _address(request)))


def _add_missing_headers(response: dict, headers: dict) -> None:
    """Add ``headers`` the response does not set itself (a 429's own ``X-RateLimit-*`` win)."""
    present = {name.lower() for key in ("headers", "multiValueHeaders") for name in (response.get(key) or {})}
    response.setdefault("headers", {}).update({k: v for k, v in headers.items() if k.lower() not in present})


def lambda_entry(app: GatewayResolver):
    """The Lambda entry point for a resolver, with Powertools logging, tracing and metrics,
    and the audit line of audited routes (``audit.py``), whatever the outcome. Answers given
    before the resolver (refusals of the pipeline, OAuth2 forms) get the CORS headers too."""
    cors = cors_config()

    # log_event=False whatever POWERTOOLS_LOGGER_LOG_EVENT says: request bodies carry secrets.
    @logger.inject_lambda_context(
        correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True, log_event=False
    )
    @tracer.capture_lambda_handler(capture_response=False)
    @metrics.log_metrics
    def lambda_handler(event: dict, context) -> dict:
        audit.begin()
        ratelimit.begin_request()
        request = gateway_event(event)
        route = routes.route_for(request.http_method, _resource(request))
        try:
            response = _form_answer(route, request)
            if response is None:
                app.append_context(principal=pipeline.admit(route, event))
        except Exception as error:  # noqa: BLE001 - every refusal leaves in the error schema
            failure = as_api_error(error)
            response = _proxy_response(
                failure.status, failure.body(request.request_context.request_id), failure.headers
            )
        if response is None:
            response = app.resolve(event, context)
        _add_missing_headers(response, ratelimit.response_headers())
        if cors is not None:
            _add_missing_headers(response, cors.to_dict(request.get_header_value("Origin")))
        if route and route.audit:
            audit.record(route.audit, event, response, _address(request))
        return response

    return lambda_handler


def principal(router: Router):
    """The caller the request pipeline authenticated (``pipeline.admit``): an
    ``auth.Principal``, or None on routes of the provisioning key."""
    return router.context.get("principal")


def header(app: GatewayResolver, name: str) -> str | None:
    """A request header, case-insensitively (clients and API Gateway vary the case)."""
    return app.current_event.get_header_value(name)


def _resource(request: APIGatewayProxyEvent | APIGatewayProxyEventV2) -> str | None:
    """The route template the gateway matched (``/orgs/{org_id}``); None for an HTTP API's
    ``$default`` route, which catches every request no route matches."""
    if isinstance(request, APIGatewayProxyEventV2):
        _method, _, path = request.route_key.partition(" ")
        return path or None
    return request.resource


def _address(request: APIGatewayProxyEvent | APIGatewayProxyEventV2) -> str:
    context = request.request_context
    identity = context.http if isinstance(request, APIGatewayProxyEventV2) else context.identity
    return identity.source_ip or "unknown"


def source_ip(app: GatewayResolver) -> str:
    """The caller's address as API Gateway saw it (``requestContext.identity.sourceIp``, or
    ``requestContext.http.sourceIp`` from an HTTP API)."""
    return _address(app.current_event)


__all__ = ["Router", "build_app", "json_response", "lambda_entry", "header", "source_ip", "dumps", "error_body"]
