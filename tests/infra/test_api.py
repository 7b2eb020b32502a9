"""The gateway of ``-c apiKind``: the HTTP API by default (a route per route, stage settings,
CORS), the REST API on request (a Lambda proxy method per route, stage settings, gateway
responses, CORS)."""

from __future__ import annotations

import json

import pytest

from price_keeper import routes
from stacks.api import UNMATCHED_FUNCTION

from .cfn import api_paths, logical_id, of_type, referenced_ids

pytestmark = pytest.mark.infra


def _methods(template: dict) -> dict[tuple[str, str], dict]:
    paths = api_paths(template)
    return {
        (m["Properties"]["HttpMethod"], paths[logical_id(m["Properties"]["ResourceId"])]): m["Properties"]
        for m in of_type(template, "AWS::ApiGateway::Method").values()
    }


def test_an_http_api_by_default_and_a_rest_api_on_request(synth, synth_rest):
    assert len(synth.resources("AWS::ApiGatewayV2::Api")) == 1
    assert not synth.resources("AWS::ApiGateway::RestApi")
    assert len(synth_rest.resources("AWS::ApiGateway::RestApi")) == 1
    assert not synth_rest.resources("AWS::ApiGatewayV2::Api")


def _http_routes(synth) -> dict[str, str]:
    """Route key → logical id of the function its integration invokes."""
    integrations = {
        key: logical_id(value["Properties"]["IntegrationUri"])
        for key, value in synth.resources("AWS::ApiGatewayV2::Integration").items()
    }
    found = {}
    for route in synth.resources("AWS::ApiGatewayV2::Route").values():
        props = route["Properties"]
        assert props["AuthorizationType"] == "NONE"  # the functions authorize (pipeline.admit)
        (integration,) = referenced_ids(props["Target"])
        found[props["RouteKey"]] = integrations[integration]
    return found


def test_every_route_is_an_http_api_route_to_its_function(synth):
    function_ids = synth.function_ids()
    expected = {f"{route.method} {route.path}": function_ids[route.function] for route in routes.ROUTES}
    # What no route matches reaches a function too, whose resolver answers 404 in the error schema.
    expected["$default"] = function_ids[UNMATCHED_FUNCTION]
    assert _http_routes(synth) == expected
    for integration in synth.resources("AWS::ApiGatewayV2::Integration").values():
        props = integration["Properties"]
        assert (props["IntegrationType"], props["PayloadFormatVersion"]) == ("AWS_PROXY", "2.0")


def _assert_invoked_only_from_routes(synth, per_function: dict[str, int]) -> None:
    """The API may invoke exactly the HTTP functions, each from one source ARN per route
    (``per_function``: those beyond the routes)."""
    function_ids = synth.function_ids()
    invoked = {}
    for permission in synth.resources("AWS::Lambda::Permission").values():
        props = permission["Properties"]
        if props["Principal"] == "apigateway.amazonaws.com":
            invoked.setdefault(logical_id(props["FunctionName"]), []).append(props["SourceArn"])
    assert set(invoked) == {function_ids[name] for name in routes.HTTP_FUNCTIONS}
    for route in routes.ROUTES:
        per_function[route.function] = per_function.get(route.function, 0) + 1
    for name, count in per_function.items():
        assert len(invoked[function_ids[name]]) == count


def test_http_api_may_invoke_each_http_function_only_from_its_routes(synth):
    _assert_invoked_only_from_routes(synth, {UNMATCHED_FUNCTION: 1})


def _http_stage(synth) -> dict:
    (stage,) = synth.resources("AWS::ApiGatewayV2::Stage").values()
    return stage["Properties"]


def test_http_stage_is_named_throttled_and_logs_json_lines(synth, synth_options):
    props = _http_stage(synth)
    assert (props["StageName"], props["AutoDeploy"]) == ("dev", True)
    throttle = props["DefaultRouteSettings"]
    assert (throttle["ThrottlingRateLimit"], throttle["ThrottlingBurstLimit"]) == (5000, 5000)  # sized for a fleet
    access_logs = props["AccessLogSettings"]
    assert logical_id(access_logs["DestinationArn"]) in synth.resources("AWS::Logs::LogGroup")
    fields = json.loads(access_logs["Format"])
    assert fields["path"] == "$context.path" and fields["routeKey"] == "$context.routeKey"
    assert fields["ip"] == "$context.identity.sourceIp" and fields["status"] == "$context.status"
    assert fields["integrationError"] == "$context.integrationErrorMessage"  # no execution logs on an HTTP API
    options = _http_stage(synth_options)
    assert options["StageName"] == "prod"
    throttle = options["DefaultRouteSettings"]
    assert (throttle["ThrottlingRateLimit"], throttle["ThrottlingBurstLimit"]) == (50, 80)


def test_http_api_cors_off_by_default_and_for_the_configured_origins(synth, synth_options):
    ((_, api),) = synth.resources("AWS::ApiGatewayV2::Api").items()
    assert "CorsConfiguration" not in api["Properties"]
    ((_, api),) = synth_options.resources("AWS::ApiGatewayV2::Api").items()
    cors = api["Properties"]["CorsConfiguration"]
    assert cors["AllowOrigins"] == ["https://a.example", "https://b.example"]
    assert {"Authorization", "Content-Type", "X-API-Key"} <= set(cors["AllowHeaders"])
    assert {route.method for route in routes.ROUTES} <= set(cors["AllowMethods"])


def test_api_url_output_is_the_stage_url_with_a_trailing_slash(synth, synth_rest):
    _, parts = synth.json["Outputs"]["ApiUrl"]["Value"]["Fn::Join"]
    assert ".execute-api." in parts and parts[-1] == "/dev/"
    _, parts = synth_rest.json["Outputs"]["ApiUrl"]["Value"]["Fn::Join"]
    (stage_id,) = synth_rest.resources("AWS::ApiGateway::Stage")
    assert ".execute-api." in parts and parts[-3:] == ["/", {"Ref": stage_id}, "/"]


def test_every_route_is_a_rest_proxy_method_of_its_function(synth_rest):
    synth = synth_rest
    methods = {key: method for key, method in _methods(synth.json).items() if key[0] != "OPTIONS"}  # CORS preflights
    function_ids = synth.function_ids()
    assert set(methods) == {(route.method, route.path) for route in routes.ROUTES}
    for route in routes.ROUTES:
        method = methods[(route.method, route.path)]
        integration = method["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["IntegrationHttpMethod"] == "POST"
        assert referenced_ids(integration["Uri"]) == {function_ids[route.function]}, route
        assert method["AuthorizationType"] == "NONE"  # the functions authorize (pipeline.admit)


def test_rest_api_may_invoke_each_http_function_only_from_its_methods(synth_rest):
    _assert_invoked_only_from_routes(synth_rest, {})  # scoped per method, no test-invoke extras


def test_rest_stage_throttling_tracing_and_json_access_logs(synth_rest):
    synth = synth_rest
    (stage,) = synth.resources("AWS::ApiGateway::Stage").values()
    props = stage["Properties"]
    assert props["StageName"] == "dev"
    assert props["TracingEnabled"] is False  # tracing=jobs, the default: no API request traced
    (settings,) = props["MethodSettings"]
    assert (settings["ThrottlingRateLimit"], settings["ThrottlingBurstLimit"]) == (50, 80)
    access_logs = props["AccessLogSetting"]
    assert logical_id(access_logs["DestinationArn"]) in synth.resources("AWS::Logs::LogGroup")
    fields = json.loads(access_logs["Format"])
    assert {"requestId", "status", "httpMethod", "resourcePath", "requestTime"} <= set(fields)
    # The concrete path (which org, which app), not only the route template.
    assert fields["path"] == "$context.path" and fields["resourcePath"] == "$context.resourcePath"
    assert fields["ip"] == "$context.identity.sourceIp"


def test_rest_stage_logs_failed_executions_without_bodies_to_a_group_with_retention(synth_rest):
    synth = synth_rest
    (stage,) = synth.resources("AWS::ApiGateway::Stage").values()
    (settings,) = stage["Properties"]["MethodSettings"]
    assert (settings["HttpMethod"], settings["ResourcePath"]) == ("*", "/*")
    assert settings["LoggingLevel"] == "ERROR" and settings["DataTraceEnabled"] is False
    (api_id,) = synth.resources("AWS::ApiGateway::RestApi")
    group_id = synth.id_of(synth.stack.api.execution_logs)
    group = synth.json["Resources"][group_id]
    assert group["Properties"]["LogGroupName"] == {
        "Fn::Join": ["", ["API-Gateway-Execution-Logs_", {"Ref": api_id}, "/dev"]]
    }
    assert group["Properties"]["RetentionInDays"] == 30 and group["DeletionPolicy"] == "Delete"
    assert group_id in stage["DependsOn"]  # it exists before API Gateway would create it without retention


def test_rest_cors_preflight_for_configured_origins(synth_rest):
    methods = _methods(synth_rest.json)
    preflight = {path for method, path in methods if method == "OPTIONS"}
    assert {route.path for route in routes.ROUTES} <= preflight
    options = methods[("OPTIONS", routes.USAGE)]
    allowed = json.dumps(options["Integration"])
    assert "https://a.example" in allowed and "https://b.example" in allowed
    assert "X-API-Key" in allowed and "Authorization" in allowed


@pytest.mark.parametrize(
    "response_type, status, code",
    [
        ("MISSING_AUTHENTICATION_TOKEN", "404", "NOT_FOUND"),
        ("THROTTLED", "429", "RATE_LIMIT_EXCEEDED"),
        ("DEFAULT_4XX", None, "INVALID_REQUEST"),
        ("DEFAULT_5XX", None, "INTERNAL_ERROR"),
    ],
)
def test_rest_gateway_answers_use_the_error_schema(synth_rest, response_type, status, code):
    synth = synth_rest
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()
    }
    response = responses[response_type]
    assert response.get("StatusCode") == status
    # What API Gateway sends once it has filled in its $context variables.
    body = response["ResponseTemplates"]["application/json"]
    body = body.replace("$context.error.messageString", json.dumps("Invalid request body"))
    body = body.replace("$context.requestId", "0f7c0a3e-1b7e-4d8e-9a51-3f1c2d4e5f60")
    parsed = json.loads(body)
    assert parsed["error"] == code
    assert isinstance(parsed["message"], str) and parsed["message"]
    assert parsed["request_id"] == "0f7c0a3e-1b7e-4d8e-9a51-3f1c2d4e5f60"


def test_rest_gateway_answers_carry_cors_headers(synth_rest):
    """Of two origins, the caller's (a template cannot choose); its own answers carry no data."""
    for response in synth_rest.resources("AWS::ApiGateway::GatewayResponse").values():
        parameters = response["Properties"]["ResponseParameters"]
        assert parameters["gatewayresponse.header.Access-Control-Allow-Origin"] == "method.request.header.Origin"
        assert parameters["gatewayresponse.header.Vary"] == "'Origin'"


def test_http_functions_answer_cors_for_the_configured_origins_only(synth, synth_options):
    """What price_keeper.http.api.cors_config reads (tests/test_cors_browser.py: in a browser)."""
    for synthesized, expected in ((synth, None), (synth_options, "https://a.example,https://b.example")):
        for name, function_id in synthesized.function_ids().items():
            environment = synthesized.json["Resources"][function_id]["Properties"]["Environment"]["Variables"]
            assert environment.get("CORS_ORIGINS") == (expected if name in routes.HTTP_FUNCTIONS else None), name
