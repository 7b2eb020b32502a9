"""Orgs and apps created through the real provisioning endpoints of the in-process handlers
(shared by the auth, provisioning and rotation tests); over HTTP, ``tests/tenants.py``."""

from __future__ import annotations

import copy
import uuid

import jwt

from price_keeper.aws import secrets as secrets_store
from price_keeper.domain import auth
from price_keeper.errors import ApiError
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table
from tests.conftest import PROVISIONING_KEY
from tests.tenants import ORG

ORG_BODY = {
    **ORG,
    "org_name": "sample_corp",
    "timezone": "America/New_York",
    "overrides": {"tight_mode_threshold_pct": 95, "agg_shard_count": 8},
}
APP_BODY = {
    "app_name": "Production API",
    "model_ordering": ["premium", "standard"],
    "quotas": {"premium": 50_000_000, "standard": 20_000_000},
    "overrides": {"tight_mode_threshold_pct": 90},
}


def org_body(**changes) -> dict:
    return {**copy.deepcopy(ORG_BODY), **changes}


def put_org(api, org_id: str, body: dict | None = None, **kw):
    return api.put(
        f"/api/v1/orgs/{org_id}",
        org_body() if body is None else body,
        api_key=kw.pop("api_key", PROVISIONING_KEY),
        **kw,
    )


def put_app(api, org_id: str, app_id: str, body: dict | None = None, **kw):
    return api.put(
        f"/api/v1/orgs/{org_id}/apps/{app_id}",
        copy.deepcopy(APP_BODY) if body is None else body,
        api_key=kw.pop("api_key", PROVISIONING_KEY),
        **kw,
    )


def new_org(api, **changes) -> tuple[str, dict]:
    """(org_id, credentials) of an org created over the API."""
    org_id = str(uuid.uuid4())
    reply = put_org(api, org_id, org_body(**changes))
    assert reply.status == 201, reply
    return org_id, reply.json()["credentials"]


def new_app(api, org_id: str, app_id: str = "app-production-api", body: dict | None = None) -> dict:
    reply = put_app(api, org_id, app_id, body)
    assert reply.status == 201, reply
    return reply.json()["credentials"]


def get_tokens(api, credentials: dict):
    return api.post("/auth/token", {**credentials, "grant_type": "client_credentials"})


def tokens(api, credentials: dict) -> dict:
    reply = get_tokens(api, credentials)
    assert reply.status == 200, reply
    return reply.json()


def refresh(api, refresh_token: str):
    return api.post("/auth/refresh", {"refresh_token": refresh_token, "grant_type": "refresh_token"})


def authorize(authorization: str | None, org_id: str, app_id: str | None = None) -> dict:
    """The authorizer step of the runtime endpoints (``http.pipeline.admit``): the claims of a
    valid, unrevoked access token allowed on ``org_id``/``app_id``."""
    claims = auth.authenticate_bearer(authorization)
    auth.check_access(claims, org_id, app_id)
    return claims


def accepted(access_token: str, org_id: str, app_id: str | None = None) -> bool:
    """Does the authorizer step of the runtime endpoints accept the token here?"""
    try:
        authorize(f"Bearer {access_token}", org_id, app_id)
        return True
    except ApiError as error:
        assert error.status == 401, error.status
        return False


def claims_of(token: str) -> dict:
    return jwt.decode(token, secrets_store.signing_key(), algorithms=["HS256"], issuer=auth.ISSUER)


def config_item(org_id: str, app_id: str | None = None) -> dict | None:
    resource = keys.app_resource(app_id) if app_id else keys.ROOT_RESOURCE
    return (
        table(tables.CONFIG)
        .get_item(Key={"org_key": keys.org_key(org_id), "resource_key": resource}, ConsistentRead=True)
        .get("Item")
    )
