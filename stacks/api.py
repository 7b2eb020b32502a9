"""The gateway (``-c apiKind``): one route per ``price_keeper.routes.ROUTES`` entry, each a
Lambda proxy integration with the function the route names.

``http`` (the default) is an HTTP API (API Gateway v2, payload format 2.0): $1.00 per million
requests instead of $3.50, and it has everything this service uses of a gateway, since the
functions authenticate, validate and rate-limit. ``rest`` is a REST API, for WAF, usage plans,
X-Ray traces of the gateway itself and execution logs. The functions read either event
(``price_keeper.http.api.GatewayResolver``); docs/infrastructure.md weighs the two.
"""

from __future__ import annotations

import json

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_integrations as integrations_v2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from price_keeper import routes
from price_keeper.http.api import CORS_EXPOSED_HEADERS, CORS_HEADERS

from .functions import RETENTION
from .settings import Settings


def _error_template(code: str, message_json: str) -> dict[str, str]:
    """A gateway response body in the api_spec error schema; ``message_json`` is a JSON
    string literal or ``$context.error.messageString`` (API Gateway quotes that one)."""
    return {"application/json": f'{{"error": "{code}", "message": {message_json}, "request_id": "$context.requestId"}}'}


# Answers API Gateway gives itself (no function runs), reshaped into the error schema.
# An unknown path or method is "missing authentication token" (403) to API Gateway; the
# spec calls it 404 NOT_FOUND. (No ISO timestamp: gateway templates cannot format one.)
GATEWAY_RESPONSES = (
    ("UnknownRoute", apigw.ResponseType.MISSING_AUTHENTICATION_TOKEN, "404", "NOT_FOUND", json.dumps("No such route")),
    (
        "Throttled",
        apigw.ResponseType.THROTTLED,
        "429",
        "RATE_LIMIT_EXCEEDED",
        json.dumps("Stage rate limit exceeded; retry later"),
    ),
    ("Default4xx", apigw.ResponseType.DEFAULT_4_XX, None, "INVALID_REQUEST", "$context.error.messageString"),
    ("Default5xx", apigw.ResponseType.DEFAULT_5_XX, None, "INTERNAL_ERROR", json.dumps("Internal error")),
)


# One JSON line per request. ``path`` is the concrete path (which org, which app), beside
# the route template ``resourcePath``: the audit trail of who touched which tenant.
ACCESS_LOG_FORMAT = apigw.AccessLogFormat.custom(
    json.dumps(
        {
            "requestId": apigw.AccessLogField.context_request_id(),
            "ip": apigw.AccessLogField.context_identity_source_ip(),
            "requestTime": apigw.AccessLogField.context_request_time(),
            "httpMethod": apigw.AccessLogField.context_http_method(),
            "resourcePath": apigw.AccessLogField.context_resource_path(),
            "path": apigw.AccessLogField.context_path(),
            "status": apigw.AccessLogField.context_status(),
            "protocol": apigw.AccessLogField.context_protocol(),
            "responseLength": apigw.AccessLogField.context_response_length(),
        }
    )
)


# The HTTP API's line: no resource path or execution logs there, so the route key and the
# error of a failed integration (a function that crashed or timed out) instead.
HTTP_ACCESS_LOG_FORMAT = apigw.AccessLogFormat.custom(
    json.dumps(
        {
            "requestId": "$context.requestId",
            "ip": "$context.identity.sourceIp",
            "requestTime": "$context.requestTime",
            "httpMethod": "$context.httpMethod",
            "routeKey": "$context.routeKey",
            "path": "$context.path",
            "status": "$context.status",
            "protocol": "$context.protocol",
            "responseLength": "$context.responseLength",
            "integrationError": "$context.integrationErrorMessage",
        }
    )
)

# Requests no route matches go to this route's function, whose resolver answers 404
# NOT_FOUND in the error schema (an HTTP API has no gateway responses to reshape).
UNMATCHED_FUNCTION = routes.route_for("GET", routes.HEALTH).function


def gateway(scope: Construct, id: str, *, settings: Settings, functions: dict[str, lambda_.IFunction]):
    """The gateway ``settings.api_kind`` names."""
    kind = HttpApi if settings.api_kind == "http" else RestApi
    return kind(scope, id, settings=settings, functions=functions)


def _log_group(api: Construct, id: str, settings: Settings, **props) -> logs.LogGroup:
    """A log group of the API's, kept for the configured days and removed with the stack."""
    return logs.LogGroup(
        api, id, retention=RETENTION[settings.log_retention_days], removal_policy=RemovalPolicy.DESTROY, **props
    )


def _access_logs(api: Construct, settings: Settings) -> logs.LogGroup | None:
    """The stage's access logs (``accessLogs``), one line a request: in the infrequent-access
    class, half the standard ingestion price, since they are searched, never streamed."""
    if not settings.access_logs:
        return None
    return _log_group(api, "AccessLogs", settings, log_group_class=logs.LogGroupClass.INFREQUENT_ACCESS)


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogs:
    """The HTTP API stage's access logs: ``group``, one ``HTTP_ACCESS_LOG_FORMAT`` line per request."""

    def __init__(self, group: logs.ILogGroup):
        self._destination = apigwv2.LogGroupLogDestination(group)

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat:
        return HTTP_ACCESS_LOG_FORMAT


class HttpApi(Construct):
    def __init__(self, scope: Construct, id: str, *, settings: Settings, functions: dict[str, lambda_.IFunction]):
        super().__init__(scope, id)
        self.access_logs = _access_logs(self, settings)
        cors = (
            apigwv2.CorsPreflightOptions(
                allow_origins=list(settings.cors_origins),
                allow_methods=[apigwv2.CorsHttpMethod(method) for method in sorted({r.method for r in routes.ROUTES})],
                allow_headers=CORS_HEADERS,
                expose_headers=CORS_EXPOSED_HEADERS,
            )
            if settings.cors_origins
            else None
        )
        self.api = apigwv2.HttpApi(
            self,
            "Api",
            api_name=f"{settings.prefix}api",
            description="Bedrock Price Keeper HTTP API",
            cors_preflight=cors,
            create_default_stage=False,
        )
        # A named stage, so the URL is <id>.execute-api.<region>.amazonaws.com/<stage>/ as with REST.
        self.stage = apigwv2.HttpStage(
            self,
            "Stage",
            http_api=self.api,
            stage_name=settings.stage,
            auto_deploy=True,
            throttle=apigwv2.ThrottleSettings(
                rate_limit=settings.throttle_rate_limit, burst_limit=settings.throttle_burst_limit
            ),
            access_log_settings=_AccessLogs(self.access_logs) if self.access_logs else None,
        )
        self.url = self.stage.url + "/"  # as a REST API's: ends with /<stage>/
        integrations = {
            name: integrations_v2.HttpLambdaIntegration(f"{name}Integration", function)
            for name, function in functions.items()
        }
        self.routes: list[apigwv2.HttpRoute] = []
        for route in routes.ROUTES:
            self.routes += self.api.add_routes(
                path=route.path, methods=[apigwv2.HttpMethod(route.method)], integration=integrations[route.function]
            )
        self.unmatched = apigwv2.HttpRoute(
            self,
            "Unmatched",
            http_api=self.api,
            route_key=apigwv2.HttpRouteKey.DEFAULT,
            integration=integrations[UNMATCHED_FUNCTION],
        )


def _cors_headers(origins: tuple[str, ...]) -> dict[str, str] | None:
    """CORS headers of the REST API's own answers (the functions give theirs): the one origin,
    or, of several, the caller's (a gateway template cannot choose among them). These answers
    (unknown route, throttling, gateway errors) carry no data."""
    if not origins:
        return None
    origin = f"'{origins[0]}'" if len(origins) == 1 else "method.request.header.Origin"
    return {"Access-Control-Allow-Origin": origin, "Vary": "'Origin'"}


class RestApi(Construct):
    def __init__(self, scope: Construct, id: str, *, settings: Settings, functions: dict[str, lambda_.IFunction]):
        super().__init__(scope, id)
        cors = (
            apigw.CorsOptions(
                allow_origins=list(settings.cors_origins),
                allow_methods=sorted({route.method for route in routes.ROUTES}),
                allow_headers=CORS_HEADERS,
            )
            if settings.cors_origins
            else None
        )
        self.access_logs = _access_logs(self, settings)
        self.api = apigw.RestApi(
            self,
            "Api",
            rest_api_name=f"{settings.prefix}api",
            description="Bedrock Price Keeper HTTP API",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # Access logging needs the account-level CloudWatch role of API Gateway.
            cloud_watch_role=True,
            default_cors_preflight_options=cors,
            deploy_options=apigw.StageOptions(
                stage_name=settings.stage,
                throttling_rate_limit=settings.throttle_rate_limit,
                throttling_burst_limit=settings.throttle_burst_limit,
                tracing_enabled=settings.tracing == "all",
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs) if self.access_logs else None,
                access_log_format=ACCESS_LOG_FORMAT if self.access_logs else None,
                # Execution logs of failed requests only (integration errors, gateway
                # 5xx), never request or response bodies: they carry client secrets and tokens.
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
            ),
        )
        self.url = self.api.url
        # API Gateway writes execution logs to a group of this fixed name, creating it
        # without retention when it is missing; created here first, it has ours and goes
        # with the stack.
        self.execution_logs = _log_group(
            self,
            "ExecutionLogs",
            settings,
            log_group_name=f"API-Gateway-Execution-Logs_{self.api.rest_api_id}/{settings.stage}",
        )
        self.api.deployment_stage.node.add_dependency(self.execution_logs)
        for response_id, response_type, status, code, message_json in GATEWAY_RESPONSES:
            self.api.add_gateway_response(
                response_id,
                type=response_type,
                status_code=status,
                templates=_error_template(code, message_json),
                response_headers=_cors_headers(settings.cors_origins),
            )
        integrations = {
            name: apigw.LambdaIntegration(function, allow_test_invoke=False) for name, function in functions.items()
        }
        self.methods: list[apigw.Method] = []
        for route in routes.ROUTES:
            resource = self.api.root if route.path == "/" else self.api.root.resource_for_path(route.path)
            self.methods.append(resource.add_method(route.method, integrations[route.function]))
