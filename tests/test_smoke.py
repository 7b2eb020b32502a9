"""The smoke test a deployer runs against their own stack: ``make smoke BASE_URL=https://... KEY=...``
(``SMOKE_BASE_URL`` / ``SMOKE_KEY``); without a base URL, against a freshly started local
server (``python -m local``, what ``make run`` starts), which is how ``make test`` and CI run it.

In order, on one new org: provisioning, tokens in JSON and as an OAuth2 form, model selection,
a usage report and a batch, today's totals showing them within seconds, credential rotation,
revoke-tokens, the console and docs pages. What it leaves behind is an org named
``smoke-test <UTC time>`` with one app ``smoke-test``, whose secrets are rotated away and
whose tokens are revoked (the API deletes no org); its spend is a few micro-dollars of
``premium``. Deadlines only bound a hang; nothing here measures speed.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests

from tests.local_server import local_server
from tests.usage_support import usage_body

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

LOCAL_KEY = "e2e-smoke-provisioning-key"
NAME = "smoke-test"
FRESH_DEADLINE_SECONDS = 60  # the aggregator folds a report within seconds (stream-driven)
TIMEOUT = 30


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(base URL, provisioning key): the stack named by SMOKE_BASE_URL / SMOKE_KEY, else a local server."""
    base_url = os.environ.get("SMOKE_BASE_URL", "").rstrip("/")
    if base_url:
        key = os.environ.get("SMOKE_KEY")
        if not key:
            pytest.fail("SMOKE_BASE_URL needs SMOKE_KEY, the stack's provisioning key (make smoke ... KEY=...)")
        yield base_url, key
        return
    with local_server(tmp_path_factory.mktemp("smoke"), LOCAL_KEY) as local_url:
        yield local_url, LOCAL_KEY


class Stack:
    """The calls of the smoke test, against one base URL."""

    def __init__(self, base_url: str, key: str):
        self.base_url, self.key = base_url, key
        self.session = requests.Session()

    def call(self, method: str, path: str, expected: int, **kwargs) -> requests.Response:
        reply = self.session.request(method, self.base_url + path, timeout=TIMEOUT, **kwargs)
        assert reply.status_code == expected, f"{method} {path}: {reply.status_code} {reply.text[:500]}"
        return reply

    def admin(self, method: str, path: str, expected: int, body: dict) -> requests.Response:
        return self.call(method, path, expected, json=body, headers={"X-API-Key": self.key})

    def bearer(self, method: str, path: str, expected: int, token: str, **kwargs) -> requests.Response:
        return self.call(method, path, expected, headers={"Authorization": f"Bearer {token}"}, **kwargs)


def _usage(label: str) -> dict:
    return usage_body(model_label=label, input_tokens=10, output_tokens=5)  # the label's own model


def test_a_tenant_end_to_end(target):
    stack = Stack(*target)
    assert stack.call("GET", "/health", 200).json()["status"]

    # Provisioning: a clearly named org and app.
    org_id = str(uuid.uuid4())
    org = f"/api/v1/orgs/{org_id}"
    app = f"{org}/apps/{NAME}"
    stack.call("PUT", org, 401, json={})  # without the key, whatever the body
    org_body = {
        "org_name": f"{NAME} {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "timezone": "UTC",
        "quota_scope": "APP",
        "model_ordering": ["premium", "standard"],
        "quotas": {"premium": 1_000_000, "standard": 1_000_000},
    }
    stack.admin("PUT", org, 201, org_body)
    credentials = stack.admin("PUT", app, 201, {"app_name": NAME}).json()["credentials"]

    # Tokens: JSON, and the OAuth2 form with HTTP Basic client authentication.
    grant = {**credentials, "grant_type": "client_credentials"}
    issued = stack.call("POST", "/auth/token", 200, json=grant).json()
    form = stack.call(
        "POST",
        "/auth/token",
        200,
        data={"grant_type": "client_credentials"},
        auth=(credentials["client_id"], credentials["client_secret"]),
    ).json()
    assert issued["access_token"] and form["access_token"] and form["token_type"].lower() == "bearer"
    token = issued["access_token"]

    # Selection, a report and a batch, and today's totals within seconds.
    selection = stack.bearer("GET", f"{app}/model-selection", 200, token).json()
    assert selection["recommended_model"]["label"] in ("premium", "standard"), selection
    stack.bearer("POST", f"{app}/usage", 202, token, json=_usage("premium"))
    batch = {"requests": [_usage("premium"), _usage("standard")]}
    assert stack.bearer("POST", f"{app}/usage/batch", 207, token, json=batch).json()["accepted"] == 2
    deadline = time.monotonic() + FRESH_DEADLINE_SECONDS
    while True:
        models = stack.bearer("GET", f"{app}/aggregates/today", 200, token).json()["models"]
        counted = {label: totals["requests"] for label, totals in models.items()}
        if counted.get("premium") == 2 and counted.get("standard") == 1:
            break
        assert time.monotonic() < deadline, f"today's totals never showed the 3 reports: {counted}"
        time.sleep(0.5)

    # Rotation (no grace: the old secret stops at once), then every token revoked.
    rotated = stack.admin("POST", f"{app}/credentials/rotate", 200, {"grace_period_hours": 0}).json()
    stack.call("POST", "/auth/token", 401, json=grant)
    fresh = {**grant, "client_secret": rotated["client_secret"]}
    refresh_token = stack.call("POST", "/auth/token", 200, json=fresh).json()["refresh_token"]
    stack.admin("POST", f"{app}/credentials/revoke-tokens", 204, {})
    stack.call("POST", "/auth/refresh", 401, json={"refresh_token": refresh_token, "grant_type": "refresh_token"})
    # Leave no working secret behind.
    stack.admin("POST", f"{app}/credentials/rotate", 200, {"grace_period_hours": 0})
    stack.admin("POST", f"{org}/credentials/rotate", 200, {"grace_period_hours": 0})

    # The pages.
    assert "<html" in stack.call("GET", "/console", 200).text.lower()
    assert "swagger" in stack.call("GET", "/docs", 200).text.lower()
    document = stack.call("GET", "/openapi.json", 200).json()
    assert org.replace(org_id, "{org_id}") in document["paths"]
