"""The served OpenAPI document is valid OpenAPI, declares the reply of every route from the
models the handlers answer through (each answer of a tour of every route is valid by it),
and a client generated from it has typed replies that read the service's real answers."""

import importlib
import json
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

import boto3
import jsonschema
import pytest
from openapi_spec_validator import validate

from price_keeper import routes
from price_keeper.aws import events as alert_events
from price_keeper.timeutil import org_date
from tests.conftest import PROVISIONING_KEY
from tests.usage_support import new_tenant, usage_body, zone_away_from_midnight

MAIN_REPLIES = {
    ("post", "/api/v1/orgs/{org_id}/apps/{app_id}/usage"): ("202", "UsageReceipt"),
    ("post", "/api/v1/orgs/{org_id}/apps/{app_id}/usage/batch"): ("207", "BatchReceipt"),
    ("get", "/api/v1/orgs/{org_id}/apps/{app_id}/model-selection"): ("200", "ModelSelection"),
    ("get", "/api/v1/orgs/{org_id}/aggregates/today"): ("200", "Aggregates"),
    ("get", "/api/v1/orgs/{org_id}/apps/{app_id}/aggregates/{date}"): ("200", "Aggregates"),
    ("post", "/auth/token"): ("200", "Tokens"),
    ("post", "/auth/refresh"): ("200", "RefreshedToken"),
}


@pytest.fixture
def document(api) -> dict:
    reply = api.get("/openapi.json")
    assert reply.status == 200, reply
    return reply.json()


def test_the_served_document_is_valid_openapi(document):
    validate(document)  # raises on any violation, e.g. a $ref to a schema the document lacks


def test_the_main_endpoints_declare_their_reply_schemas(document):
    schemas = document["components"]["schemas"]
    for (method, path), (status, name) in MAIN_REPLIES.items():
        content = document["paths"][path][method]["responses"][status]["content"]["application/json"]
        assert content["schema"] == {"$ref": f"#/components/schemas/{name}"}, (method, path)
        assert schemas[name]["properties"], name


def test_a_generated_client_has_typed_replies(document, api, tmp_path):
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(document))
    subprocess.run(
        [generator, "generate", "--path", str(spec), "--output-path", str(tmp_path / "generated"), "--meta", "none"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        models = importlib.import_module("generated.models")
        tenant = new_tenant()
        answer = api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token)
        assert answer.status == 202, answer
        receipt = models.UsageReceipt.from_dict(answer.json())
        assert isinstance(receipt.processing, models.Processing)
        assert receipt.processing.cost_usd_micros == answer.json()["processing"]["cost_usd_micros"] == 3760
        assert receipt.daily_total.label == "premium" and receipt.duplicate is False
        selection = api.get(f"{tenant.app_path}/model-selection", token=tenant.token)
        chosen = models.ModelSelection.from_dict(selection.json())
        assert chosen.recommended_model.label == selection.json()["recommended_model"]["label"]
        assert isinstance(chosen.quota_status.total, models.TotalStatus)
        rotated = api.post(f"{tenant.app_path}/credentials/rotate", {}, api_key=PROVISIONING_KEY)
        assert rotated.status == 200, rotated
        rotation = models.RotatedCredentials.from_dict(rotated.json())
        assert isinstance(rotation.rotation, models.RotationWindow)
        assert (rotation.app_id, rotation.rotation.grace_period_hours) == (tenant.app_id, 168)
        info = models.ServiceInfo.from_dict(api.get("/").json())
        assert info.endpoints.health == "/health"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == "generated" or name.startswith("generated.")]:
            del sys.modules[name]


# --- every route's replies, typed and true -------------------------------------------------

PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
# Routes that are no API operation: the document itself and two HTML pages.
UNDOCUMENTED = {routes.OPENAPI, routes.DOCS, routes.CONSOLE}
API_ROUTES = [route for route in routes.ROUTES if route.path not in UNDOCUMENTED]


def component(document: dict, schema: dict) -> dict | None:
    """The component schema ``schema`` refers to; None for an inline (unnamed) schema."""
    reference = schema.get("$ref", "")
    prefix = "#/components/schemas/"
    return document["components"]["schemas"][reference[len(prefix) :]] if reference.startswith(prefix) else None


def untyped_replies(document: dict) -> list[str]:
    """Each 2xx reply of a route that has no named object schema (or a 204 that has a body)."""
    found = []
    for route in API_ROUTES:
        operation = document["paths"].get(route.path, {}).get(route.method.lower())
        if operation is None:
            found.append(f"{route.method} {route.path}: not in the document")
            continue
        successes = {status: reply for status, reply in operation["responses"].items() if status.startswith("2")}
        if not successes:
            found.append(f"{route.method} {route.path}: no 2xx reply")
        for status, reply in successes.items():
            content = reply.get("content", {})
            if status == "204":
                if content:
                    found.append(f"{route.method} {route.path} 204: a body")
                continue
            model = component(document, content.get("application/json", {}).get("schema", {}))
            if not (model and model.get("type") == "object" and model.get("additionalProperties") is False):
                found.append(f"{route.method} {route.path} {status}: untyped")
    return found


def test_every_route_declares_a_typed_reply(document):
    """Every 2xx reply of every API route is a named model that lists its fields and no others
    (an empty ``{}`` or a bare ``object`` would leave a generated client with a dict)."""
    assert untyped_replies(document) == []
    assert not any(route.path in document["paths"] for route in routes.ROUTES if route.path in UNDOCUMENTED)


def test_the_typing_check_sees_an_untyped_reply(document):
    loose = json.loads(json.dumps(document))
    rotate = loose["paths"][routes.ORG_ROTATE]["post"]["responses"]["200"]
    rotate["content"]["application/json"]["schema"] = {"type": "object"}
    revoke = loose["paths"][routes.ORG_REVOKE_TOKENS]["post"]["responses"]["204"]
    revoke["content"] = {"application/json": {"schema": {}}}
    del loose["paths"][routes.ALERTS]
    assert untyped_replies(loose) == [
        f"POST {routes.ORG_ROTATE} 200: untyped",
        f"POST {routes.ORG_REVOKE_TOKENS} 204: a body",
        f"GET {routes.ALERTS}: not in the document",
    ]


class Replies:
    """Checks each answer against the schema the document declares for its route and status
    (JSON Schema 2020-12, the dialect of OpenAPI 3.1), and remembers which it checked."""

    def __init__(self, document: dict):
        self.document = document
        self.checked: set[tuple[str, str, str]] = set()

    def check(self, route: routes.Route, reply) -> dict | str:
        status = str(reply.status)
        assert status.startswith("2"), (route.path, reply)
        declared = self.document["paths"][route.path][route.method.lower()]["responses"]
        assert status in declared, f"{route.method} {route.path} answered {status}, which it does not declare"
        if status == "204":
            assert reply.text == "" and "content" not in declared[status]
            self.checked.add((route.method, route.path, status))
            return {}
        content_type = reply.headers.get("content-type", "").split(";")[0]
        body = reply.json() if content_type == "application/json" else reply.text
        schema = declared[status]["content"][content_type]["schema"]
        jsonschema.Draft202012Validator(
            {**schema, "components": self.document["components"]},
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
        ).validate(body)
        self.checked.add((route.method, route.path, status))
        return body


def test_every_reply_is_valid_by_its_documented_schema(api, document, bedrock_endpoint, fold_stream):
    """One tenant's life over the API, every route and each 2xx status it declares, each answer
    checked against the document: the models the handlers answer through are the wire."""
    replies = Replies(document)

    def call(method: str, path: str, body=None, **kw):
        route, _ = routes.match(method, path)
        return replies.check(route, api.request(method, path, body, **kw))

    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    admin = {"api_key": PROVISIONING_KEY}
    org_id, app_id = str(uuid.uuid4()), "tour-app"
    org_path, app_path = f"/api/v1/orgs/{org_id}", f"/api/v1/orgs/{org_id}/apps/{app_id}"
    org_config = {
        "org_name": "tour",
        "timezone": zone_away_from_midnight(),
        "quota_scope": "APP",
        "model_ordering": ["premium", "standard"],
        "quotas": {"premium": 5_000, "standard": 5_000_000},
    }

    call("GET", "/")
    call("GET", "/health")
    org = call("PUT", org_path, org_config, **admin)
    call("PUT", org_path, org_config, **admin)
    created = call("PUT", app_path, {"app_name": "tour"}, **admin)
    call("PUT", app_path, {"app_name": "tour, renamed"}, **admin)

    credentials = {**created["credentials"], "grant_type": "client_credentials"}
    tokens = call("POST", "/auth/token", credentials)
    call("POST", "/auth/refresh", {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]})
    token = tokens["access_token"]
    org_token = call("POST", "/auth/token", {**org["credentials"], "grant_type": "client_credentials"})["access_token"]

    record = usage_body()
    call("POST", f"{app_path}/usage", record, token=token)
    call("POST", f"{app_path}/usage/batch", {"requests": [usage_body()]}, token=token)
    fold_stream()  # and premium's small quota is passed: THRESHOLD alerts
    call("GET", f"{app_path}/model-selection", token=token)
    day = org_date(org_config["timezone"]).isoformat()
    for path, bearer in ((org_path, org_token), (app_path, token)):
        call("GET", f"{path}/aggregates/today", token=bearer)
        call("GET", f"{path}/aggregates/{day}", token=bearer)
    held = call(
        "POST",
        f"{app_path}/reservations",
        {"model_label": "standard", "max_input_tokens": 1_000, "max_output_tokens": 100},
        token=token,
    )
    call("DELETE", f"{app_path}/reservations/{held['reservation_id']}", token=token)
    call(
        "POST",
        f"{app_path}/inference-profiles",
        {"profile_label": "tour-profile", "inference_profile_arn": PROFILE_ARN, "description": "a tour"},
        token=token,
    )
    report = call("GET", f"{org_path}/reports/spend", token=org_token, query=f"from={day}&to={day}")
    assert report["rows"], report
    call("GET", f"{org_path}/reports/spend", token=org_token, query=f"from={day}&to={day}&format=csv")
    listed = call("GET", f"{org_path}/alerts", token=org_token)
    assert listed["alerts"], listed
    expires = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    boost = {"model_label": "premium", "amount_usd_micros": 1_000, "expires_at": expires, "app_id": app_id}
    call("POST", f"{org_path}/quota-boosts", boost, **admin)
    void = {"app_id": app_id, "request_ids": [record["request_id"]], "reason": "a tour"}
    assert call("POST", f"{org_path}/usage/void", void, **admin)["voided"] == 1
    call("GET", "/api/v1/reconciliation", **admin)

    revoked = call("POST", "/auth/token", credentials)
    call("POST", "/auth/revoke", {"token": revoked["refresh_token"]}, token=token)
    form = urlencode({"token": tokens["refresh_token"], **created["credentials"]})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    call("POST", "/auth/revoke", form, headers=headers)
    call("POST", f"{org_path}/credentials/rotate", {"grace_period_hours": 1}, **admin)
    call("POST", f"{app_path}/credentials/rotate", None, **admin)
    call("POST", f"{org_path}/credentials/revoke-tokens", {}, **admin)
    call("POST", f"{app_path}/credentials/revoke-tokens", None, **admin)

    declared = {
        (route.method, route.path, status)
        for route in API_ROUTES
        for status in document["paths"][route.path][route.method.lower()]["responses"]
        if status.startswith("2")
    }
    assert replies.checked == declared


def test_the_reply_check_sees_a_field_off_its_model(api, document):
    replies = Replies(document)
    route, _ = routes.match("GET", "/")
    answer = api.get("/")
    body = replies.check(route, answer)
    answer.text = json.dumps({**body, "extra": 1})
    with pytest.raises(jsonschema.ValidationError, match="extra"):
        replies.check(route, answer)
    answer.text = json.dumps({key: value for key, value in body.items() if key != "version"})
    with pytest.raises(jsonschema.ValidationError, match="version"):
        replies.check(route, answer)
