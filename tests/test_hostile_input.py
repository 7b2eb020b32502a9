"""Hostile request bodies on the endpoints that take one: each is a 400 ``INVALID_REQUEST``
in the error schema (never a 500, never accepted) and writes nothing.

Every body of the API is one JSON object (but the OAuth2 forms of the token endpoints,
tests/test_oauth.py). Powertools' default parsing let an array through
as its first element, kept the last of two equal keys, and answered deep nesting or a
5,000-digit number with a 500 (``api.parse_body`` now parses bodies).
"""

import json
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlencode

import pytest

from price_keeper.domain import auth
from price_keeper.store.tables import ALL_TABLES
from tests.conftest import PROVISIONING_KEY, assert_error
from tests.factories import seed_org
from tests.provisioned import org_body
from tests.usage_support import all_items, new_tenant, usage_body

DEPTH = 10_000
JSON = "application/json"


@dataclass
class Endpoint:
    method: str
    path: str
    body: dict  # a valid body: each hostile body is made from it
    credentials: dict = field(default_factory=dict)


def usage() -> Endpoint:
    tenant = new_tenant()
    return Endpoint("POST", f"{tenant.app_path}/usage", usage_body(), {"token": tenant.token})


def usage_batch() -> Endpoint:
    tenant = new_tenant()
    return Endpoint("POST", f"{tenant.app_path}/usage/batch", {"requests": [usage_body()]}, {"token": tenant.token})


def org_put() -> Endpoint:
    return Endpoint("PUT", f"/api/v1/orgs/{uuid.uuid4()}", org_body(), {"api_key": PROVISIONING_KEY})


def token() -> Endpoint:
    body = {
        "client_id": auth.client_id_for(seed_org()),
        "client_secret": "org-secret",
        "grant_type": "client_credentials",
    }
    return Endpoint("POST", "/auth/token", body)


ENDPOINTS = {"usage": usage, "usage batch": usage_batch, "org PUT": org_put, "auth token": token}


def first_value_as(body: dict, raw: str) -> str:
    """``body`` as JSON text with its first member's value replaced by the JSON text ``raw``."""
    first, *_ = body
    rest = json.dumps({name: value for name, value in body.items() if name != first})
    return "{" + json.dumps(first) + ": " + raw + ", " + rest[1:]


def first_member_twice(body: dict) -> str:
    first, value = next(iter(body.items()))
    return json.dumps(body)[:-1] + ", " + json.dumps(first) + ": " + json.dumps(value) + "}"


def invalid_utf8(body: dict) -> list[bytes]:
    text = json.dumps(body).encode()
    return [text[:-1] + b" \xff}", text.replace(b'"', b'"\xc3\x28', 1), text.decode().encode("utf-16")]


# name: (Content-Type, valid body -> hostile body)
HOSTILE = {
    "top-level array": (JSON, lambda body: json.dumps([body])),
    "string": (JSON, lambda body: '"x"'),
    "number": (JSON, lambda body: "42"),
    "null": (JSON, lambda body: "null"),
    "duplicate key": (JSON, first_member_twice),
    "integer 10**40": (JSON, lambda body: first_value_as(body, str(10**40))),
    "5,000-digit integer": (JSON, lambda body: first_value_as(body, "9" * 5000)),
    "array nested 10,000 deep": (JSON, lambda body: first_value_as(body, "[" * DEPTH + "]" * DEPTH)),
    "object nested 10,000 deep": (JSON, lambda body: first_value_as(body, '{"a": ' * DEPTH + "1" + "}" * DEPTH)),
    "invalid UTF-8 after the last member": (JSON, lambda body: invalid_utf8(body)[0]),
    "invalid UTF-8 in a key": (JSON, lambda body: invalid_utf8(body)[1]),
    "UTF-16": (JSON, lambda body: invalid_utf8(body)[2]),
    "text/plain": ("text/plain", json.dumps),
    "form": ("application/x-www-form-urlencoded", urlencode),
    "multipart": ("multipart/form-data; boundary=x", json.dumps),
}


def stored() -> dict:
    return {spec.physical_name: all_items(spec) for spec in ALL_TABLES}


def send(api, endpoint: Endpoint, body, content_type: str = JSON):
    return api.request(
        endpoint.method, endpoint.path, body=body, headers={"Content-Type": content_type}, **endpoint.credentials
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_valid_body_each_hostile_one_is_made_from_is_accepted(api, endpoint):
    target = ENDPOINTS[endpoint]()
    before = stored()
    reply = send(api, target, json.dumps(target.body))
    assert reply.status in (200, 201, 202, 207), reply
    if endpoint != "auth token":  # issuing tokens writes nothing
        assert stored() != before


# A form is an OAuth2 token request there (tests/test_oauth.py has its hostile forms).
HOSTILE_CASES = [
    (endpoint, hostile)
    for endpoint in ENDPOINTS
    for hostile in HOSTILE
    if (endpoint, hostile) != ("auth token", "form")
]


@pytest.mark.parametrize("endpoint, hostile", HOSTILE_CASES)
def test_hostile_body_is_400_and_writes_nothing(api, endpoint, hostile):
    target = ENDPOINTS[endpoint]()
    content_type, make = HOSTILE[hostile]
    before = stored()
    assert_error(send(api, target, make(target.body), content_type), 400, "INVALID_REQUEST")
    assert stored() == before


@pytest.mark.parametrize(
    "endpoint, change, location",
    [
        ("usage", {"input_tokens": 10**40}, ["body", "input_tokens"]),
        ("org PUT", {"quotas": {"premium": 10**40, "standard": 1, "economy": 1}}, ["body", "quotas", "premium"]),
    ],
)
def test_a_number_too_large_for_its_field_is_400_and_writes_nothing(api, endpoint, change, location):
    target = ENDPOINTS[endpoint]()
    before = stored()
    body = assert_error(send(api, target, json.dumps({**target.body, **change})), 400, "INVALID_REQUEST")
    assert [error["loc"] for error in body["details"]["errors"]] == [location]
    assert stored() == before
