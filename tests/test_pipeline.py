"""The request pipeline (``price_keeper.http.pipeline``): every route authenticates as it declares,
before its body is read, and the OpenAPI document says what is enforced."""

from __future__ import annotations

import uuid

import pytest

from price_keeper import routes
from price_keeper.routes import Auth
from tests.conftest import assert_error
from tests.factories import seed_app, seed_org, token_for

BODIES = ['{"not": "valid"}', "[1, 2]", "not json at all", ""]
WRITE_ROUTES = [routes.USAGE, routes.USAGE_BATCH, routes.INFERENCE_PROFILES]


def concrete(path: str, org_id: str, app_id: str = "app-1") -> str:
    return path.replace("{org_id}", org_id).replace("{app_id}", app_id)


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("path", WRITE_ROUTES)
def test_no_credentials_is_401_whatever_the_body(api, path, body):
    org_id = seed_org()
    seed_app(org_id, "app-1")
    reply = api.post(concrete(path, org_id), body, headers={"Content-Type": "application/json"})
    assert_error(reply, 401, "UNAUTHORIZED")


@pytest.mark.parametrize("body", BODIES)
def test_no_provisioning_key_is_401_whatever_the_body(api, body):
    reply = api.put(f"/api/v1/orgs/{uuid.uuid4()}", body, headers={"Content-Type": "application/json"})
    assert_error(reply, 401, "UNAUTHORIZED")


def test_a_token_of_another_app_is_403_before_the_body_is_read(api):
    org_id = seed_org()
    seed_app(org_id, "app-1")
    reply = api.post(
        concrete(routes.USAGE, org_id),
        "[]",
        token=token_for(org_id, "app-2"),
        headers={"Content-Type": "application/json"},
    )
    assert_error(reply, 403, "FORBIDDEN")


def test_the_openapi_security_of_every_route_is_its_declared_auth(api):
    """...and, on the token endpoints, the client authentication of their OAuth2 forms: HTTP
    Basic, or in the body (which no security scheme can say: the empty requirement)."""
    document = api.get(routes.OPENAPI).json()
    expected = {
        Auth.BEARER: [{"bearerAuth": []}],
        Auth.BEARER_ANY: [{"bearerAuth": []}],
        Auth.PROVISIONING_KEY: [{"provisioningKey": []}],
    }
    oauth_forms = {routes.AUTH_TOKEN, routes.AUTH_REFRESH, routes.AUTH_REVOKE}
    for route in routes.ROUTES:
        operation = document["paths"].get(route.path, {}).get(route.method.lower())
        if operation is None:  # the docs function's own pages are not in the document
            assert route.function == "docs", route
            continue
        forms = [{"clientBasic": []}, {}] if route.path in oauth_forms else []
        assert operation.get("security") == (expected.get(route.auth, []) + forms or None), route


def test_handlers_leave_authentication_to_the_pipeline():
    """Only the token endpoints authenticate a client themselves (``Auth.CLIENT``), and the
    revocation endpoint revokes through ``auth`` for the principal the pipeline gave it."""
    from pathlib import Path

    lambdas = Path(__file__).resolve().parent.parent / "lambdas"
    calling_auth = sorted(path.parent.name for path in lambdas.glob("*/handler.py") if "auth." in path.read_text())
    assert calling_auth == ["auth_refresh", "auth_revoke", "auth_token"]
    client_routes = {route.function for route in routes.ROUTES if route.auth == Auth.CLIENT}
    assert client_routes == {"auth_token", "auth_refresh"}
