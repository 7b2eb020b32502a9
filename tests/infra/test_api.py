"""The REST API: a Lambda proxy method per route, stage settings, gateway responses, CORS."""

from __future__ import annotations

import json

import pytest

from price_keeper.http import routes

from .cfn import api_paths, logical_id, of_type, referenced_ids

pytestmark = pytest.mark.infra


def _methods(template: dict) -> dict[tuple[str, str], dict]:
    paths = api_paths(template)
    return {
        (m["Properties"]["HttpMethod"], paths[logical_id(m["Properties"]["ResourceId"])]): m["Properties"]
        for m in of_type(template, "AWS::ApiGateway::Method").values()
    }


def test_one_rest_api(synth):
    assert len(synth.resources("AWS::ApiGateway::RestApi")) == 1
    assert not synth.resources("AWS::ApiGatewayV2::Api")


def test_every_route_is_a_proxy_method_of_its_function(synth):
    methods = _methods(synth.json)
    function_ids = synth.function_ids()
    assert set(methods) == {(route.method, route.path) for route in routes.ROUTES}
    for route in routes.ROUTES:
        method = methods[(route.method, route.path)]
        integration = method["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["IntegrationHttpMethod"] == "POST"
        assert referenced_ids(integration["Uri"]) == {function_ids[route.function]}, route
        assert method["AuthorizationType"] == "NONE"  # the functions authorize (auth.authorize)


def test_api_may_invoke_each_http_function_only_from_its_methods(synth):
    function_ids = synth.function_ids()
    invoked = {}
    for permission in synth.resources("AWS::Lambda::Permission").values():
        props = permission["Properties"]
        if props["Principal"] == "apigateway.amazonaws.com":
            invoked.setdefault(logical_id(props["FunctionName"]), []).append(props["SourceArn"])
    assert set(invoked) == {function_ids[name] for name in routes.HTTP_FUNCTIONS}
    per_function = {}
    for route in routes.ROUTES:
        per_function[route.function] = per_function.get(route.function, 0) + 1
    for name, count in per_function.items():
        assert len(invoked[function_ids[name]]) == count  # scoped per method, no test-invoke extras


def test_stage_throttling_tracing_and_json_access_logs(synth):
    (stage,) = synth.resources("AWS::ApiGateway::Stage").values()
    props = stage["Properties"]
    assert props["StageName"] == "dev"
    assert props["TracingEnabled"] is True
    (settings,) = props["MethodSettings"]
    assert (settings["ThrottlingRateLimit"], settings["ThrottlingBurstLimit"]) == (5000, 5000)
    access_logs = props["AccessLogSetting"]
    assert logical_id(access_logs["DestinationArn"]) in synth.resources("AWS::Logs::LogGroup")
    fields = json.loads(access_logs["Format"])
    assert {"requestId", "status", "httpMethod", "resourcePath", "requestTime"} <= set(fields)
    # The concrete path (which org, which app), not only the route template.
    assert fields["path"] == "$context.path" and fields["resourcePath"] == "$context.resourcePath"
    assert fields["ip"] == "$context.identity.sourceIp"


def test_stage_logs_failed_executions_without_bodies_to_a_group_with_retention(synth):
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


def test_throttling_and_stage_from_context(synth_options):
    (stage,) = synth_options.resources("AWS::ApiGateway::Stage").values()
    (settings,) = stage["Properties"]["MethodSettings"]
    assert stage["Properties"]["StageName"] == "prod"
    assert (settings["ThrottlingRateLimit"], settings["ThrottlingBurstLimit"]) == (50, 80)


def test_cors_off_by_default(synth):
    assert "OPTIONS" not in {method for method, _ in _methods(synth.json)}


def test_cors_preflight_for_configured_origins(synth_options):
    methods = _methods(synth_options.json)
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
def test_gateway_answers_use_the_error_schema(synth, response_type, status, code):
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
