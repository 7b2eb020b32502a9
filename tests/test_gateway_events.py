"""The same functions behind either gateway of ``-c apiKind``: each request below goes once as
an HTTP API event (payload format 2.0) and once as a REST API event (1.0), and is answered
alike (``price_keeper.http.api.GatewayResolver``)."""

from __future__ import annotations

import logging
import uuid

import pytest

from local import gateway
from price_keeper import routes
from stacks.api import UNMATCHED_FUNCTION
from tests.conftest import PROVISIONING_KEY, Api, Reply, assert_error, cold_handler
from tests.provisioned import ORG_BODY, new_app, new_org, tokens
from tests.test_oauth import basic, form

pytestmark = pytest.mark.handler


@pytest.fixture(params=gateway.KINDS)
def kind_api(aws, request) -> Api:
    return Api(request.param)


def test_the_local_gateway_serves_the_stacks_default_kind():
    from stacks.settings import Settings

    assert gateway.DEFAULT_KIND == Settings().api_kind == "http"
    event, _ = gateway.api_event("GET", routes.HEALTH)
    assert event["version"] == "2.0" and event["routeKey"] == f"GET {routes.HEALTH}"


def test_the_local_gateway_runs_each_function_one_request_at_a_time_and_never_crosses_requests(aws, monkeypatch):
    """Powertools keeps a resolver's current event in a class attribute that every resolver
    of a process shares (``BaseRouter.current_event``). Deployed, each function is a process
    of its own; the local server runs them all in one, where two functions resolving at once
    read each other's request (a reservation was once validated against a usage report's
    body, under 64 concurrent e2e clients). Here each thread keeps its own (``local.gateway``):
    different functions serve at once, each one request at a time (its resolver's context is
    one dict), and every answer is its own request's."""
    import threading
    import time

    from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

    load = gateway.load_handler
    running: dict[str, int] = {}
    same_function_overlaps, crossed = [], []

    def watched(function: str):
        handler = load(function)

        def run(event, context):
            running[function] = running.get(function, 0) + 1
            if running[function] > 1:
                same_function_overlaps.append(function)
            time.sleep(0.005)
            reply = handler(event, context)
            if BaseRouter.current_event.raw_event is not event:  # what this request's resolver read last
                crossed.append(function)
            running[function] -= 1
            return reply

        return run

    monkeypatch.setattr(gateway, "load_handler", watched)
    threads = [
        threading.Thread(target=lambda path=path: [gateway.invoke("GET", path) for _ in range(20)])
        for path in (routes.HEALTH, routes.HEALTH, routes.OPENAPI)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert same_function_overlaps == [] and crossed == []


def test_provisioning_tokens_and_a_bearer_call_with_path_ids(kind_api):
    org_id, _ = new_org(kind_api)
    credentials = new_app(kind_api, org_id, "app-1")
    access = tokens(kind_api, credentials)["access_token"]
    reply = kind_api.get(f"/api/v1/orgs/{org_id}/apps/app-1/model-selection", token=access)
    assert reply.status == 200, reply
    assert reply.json()["app_id"] == "app-1"
    # The token is checked against the path's ids, whichever event carried them.
    assert_error(kind_api.get(f"/api/v1/orgs/{org_id}/apps/app-2/model-selection", token=access), 403, "FORBIDDEN")


def test_a_query_parameter_and_a_missing_header(kind_api):
    org_id, credentials = new_org(kind_api)
    access = tokens(kind_api, credentials)["access_token"]
    reply = kind_api.get(f"/api/v1/orgs/{org_id}/reports/spend", token=access, query="app_id=bad%20id")
    assert_error(reply, 400, "INVALID_REQUEST")
    assert_error(kind_api.get(f"/api/v1/orgs/{org_id}/reports/spend"), 401, "UNAUTHORIZED")


def test_an_oauth2_form_and_a_bad_json_body(kind_api):
    org_id, credentials = new_org(kind_api)
    reply = form(
        kind_api,
        "/auth/token",
        {"grant_type": "client_credentials"},
        basic(credentials["client_id"], credentials["client_secret"]),
    )
    assert reply.status == 200, reply
    assert reply.json()["token_type"].lower() == "bearer"
    bad = kind_api.put(f"/api/v1/orgs/{uuid.uuid4()}", "{not json", api_key=PROVISIONING_KEY)
    assert_error(bad, 400, "INVALID_REQUEST")


def test_the_audit_line_names_the_callers_address(kind_api, caplog):
    caplog.set_level(logging.INFO)
    org_id = str(uuid.uuid4())
    kind_api.put(f"/api/v1/orgs/{org_id}", {}, api_key=PROVISIONING_KEY, source_ip="198.51.100.7")
    (line,) = [vars(record) for record in caplog.records if record.getMessage() == "audit"]
    assert line["source_ip"] == "198.51.100.7" and line["org_id"] == org_id


def test_the_http_apis_default_route_answers_404_in_the_error_schema(aws):
    """What the stack's ``$default`` route sends for a path no route matches."""
    event, _ = gateway.api_event("GET", routes.HEALTH)
    event.update(routeKey="$default", rawPath="/nowhere")
    event["requestContext"].update(routeKey="$default", http={**event["requestContext"]["http"], "path": "/nowhere"})
    handler = gateway.load_handler(UNMATCHED_FUNCTION)
    reply = Reply(handler(event, gateway.LambdaContext(function_name=UNMATCHED_FUNCTION)))
    assert_error(reply, 404, "NOT_FOUND")


def _through_stage(method: str, path: str, kind: str, stage: str) -> Reply:
    """``method path`` as the gateway sends it when the URL names ``stage`` (``/dev/health``)."""
    event, function = gateway.api_event(method, path, kind=kind)
    if kind == "http":
        event["rawPath"] = f"/{stage}{path}"
        event["requestContext"].update(stage=stage, http={**event["requestContext"]["http"], "path": event["rawPath"]})
    else:
        event["requestContext"].update(stage=stage, path=f"/{stage}{path}")
    return Reply(gateway.load_handler(function)(event, gateway.LambdaContext(function_name=function)))


@pytest.mark.parametrize("kind", gateway.KINDS)
def test_a_named_stage_in_the_path_is_not_part_of_the_route(aws, kind):
    """Deployed, the stage prefixes the URL (``/dev/health``); Powertools strips it."""
    reply = _through_stage("GET", routes.HEALTH, kind, "dev")
    assert reply.status in (200, 503) and "status" in reply.json(), reply


@pytest.mark.parametrize("kind", gateway.KINDS)
def test_the_openapi_servers_are_the_stage_the_document_was_asked_through(aws, kind):
    """Swagger UI's "Try it out" and generated clients call ``servers``: ``/dev`` deployed."""
    assert _through_stage("GET", routes.OPENAPI, kind, "dev").json()["servers"] == [{"url": "/dev"}]
    assert _through_stage("GET", routes.OPENAPI, kind, "prod").json()["servers"] == [{"url": "/prod"}]
    page = _through_stage("GET", routes.DOCS, kind, "dev").text
    assert '"servers":[{"url":"/dev"}]' in page.replace(" ", "")
    # Served at the root (the local server, a custom domain): the root.
    reply = Reply(gateway.invoke("GET", routes.OPENAPI, kind=kind))
    assert reply.json()["servers"] == [{"url": "/"}]


@pytest.mark.parametrize("kind", gateway.KINDS)
def test_cors_headers_on_answers_and_refusals_for_the_allowed_origins_only(aws, monkeypatch, kind):
    """``corsOrigins`` reaches the functions as ``CORS_ORIGINS`` (tests/test_cors_browser.py: in a browser)."""
    monkeypatch.setenv("CORS_ORIGINS", "https://a.example,https://b.example")
    handler = cold_handler("put_org")

    def put(origin: str, key: str) -> Reply:
        headers = {"Content-Type": "application/json", "X-API-Key": key, "Origin": origin}
        event, function = gateway.api_event(
            "PUT", f"/api/v1/orgs/{uuid.uuid4()}", body=ORG_BODY, headers=headers, kind=kind
        )
        return Reply(handler(event, gateway.LambdaContext(function_name=function)))

    created = put("https://b.example", PROVISIONING_KEY)
    assert created.status == 201 and created.headers["access-control-allow-origin"] == "https://b.example"
    assert "x-ratelimit-remaining" in created.headers["access-control-expose-headers"].lower()
    refused = put("https://a.example", "wrong")  # the pipeline's refusal, before the resolver
    assert refused.status == 401 and refused.headers["access-control-allow-origin"] == "https://a.example"
    other = put("https://elsewhere.example", PROVISIONING_KEY)
    assert other.status == 201 and "access-control-allow-origin" not in other.headers
