"""End to end over real HTTP: the local server (``python -m local``) in a subprocess resolves
inference profiles with its Bedrock stand-in. Register a system-defined profile of the
local account and report usage on it; create an application profile through the server's
Bedrock endpoint with boto3 and do the same; another account's profile is refused.
A registered application profile still prices usage after a restart of a persistent
local stack."""
from __future__ import annotations

import contextlib
import io
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

import boto3
import pytest
import requests

from tests.local_server import local_server

KEY = "e2e-profiles-provisioning-key"
US_NOVA_2_LITE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-2-lite-v1:0"
NOVA_2_LITE_COST = 330 + 1375  # 1,000 input x 0.33 + 500 output x 2.75 USD per 1M (config.yaml "standard")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with local_server(tmp_path_factory.mktemp("profiles"), KEY) as url:
        yield url


class App(NamedTuple):
    base_url: str
    path: str
    bearer: dict

    def at(self, base_url: str) -> "App":
        """The same app on a restarted server (another port)."""
        return self._replace(base_url=base_url)

    def post(self, resource: str, body: dict) -> requests.Response:
        return requests.post(f"{self.base_url}{self.path}/{resource}", json=body, headers=self.bearer, timeout=10)


@pytest.fixture(scope="module")
def app(base_url) -> App:
    return provision(base_url)


def provision(base_url: str) -> App:
    """A new org and its app "web", with the app's access token."""
    org_id, admin = str(uuid.uuid4()), {"X-API-Key": KEY}
    org = requests.put(f"{base_url}/api/v1/orgs/{org_id}", headers=admin, timeout=10,
                       json={"org_name": "profiles e2e", "timezone": "UTC", "quota_scope": "APP",
                             "model_ordering": ["standard"], "quotas": {"standard": 1_000_000}})
    assert org.status_code == 201, org.text
    created = requests.put(f"{base_url}/api/v1/orgs/{org_id}/apps/web", headers=admin, timeout=10,
                           json={"app_name": "Web"})
    assert created.status_code == 201, created.text
    tokens = requests.post(f"{base_url}/auth/token", timeout=10,
                           json={**created.json()["credentials"], "grant_type": "client_credentials"})
    assert tokens.status_code == 200, tokens.text
    bearer = {"Authorization": f"Bearer {tokens.json()['access_token']}"}
    return App(base_url, f"/api/v1/orgs/{org_id}/apps/web", bearer)


def register(app: App, label: str, arn: str) -> requests.Response:
    return app.post("inference-profiles", {"profile_label": label, "inference_profile_arn": arn})


def report(app: App, label: str, arn: str, region: str) -> requests.Response:
    return app.post("usage", {
        "request_id": str(uuid.uuid4()), "model_label": label, "bedrock_model_id": arn, "calling_region": region,
        "input_tokens": 1000, "output_tokens": 500, "status": "OK",
        "timestamp": (datetime.now(timezone.utc) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")})


def bedrock(base_url: str):
    """A developer's boto3 Bedrock client of the local stack."""
    return boto3.client("bedrock", region_name="us-east-1", endpoint_url=base_url, aws_access_key_id="local",
                        aws_secret_access_key="local")


def test_usage_on_a_system_defined_profile_of_the_local_account(app):
    assert register(app, "nova-lite-us", US_NOVA_2_LITE).status_code == 201
    accepted = report(app, "nova-lite-us", US_NOVA_2_LITE, "us-east-1")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST


def test_usage_on_an_application_profile_created_through_the_local_server(base_url, app):
    arn = bedrock(base_url).create_inference_profile(inferenceProfileName="web-nova-lite",
                                                     modelSource={"copyFrom": US_NOVA_2_LITE})["inferenceProfileArn"]
    assert arn.startswith("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/")
    assert register(app, "web-nova-lite", arn).status_code == 201
    accepted = report(app, "web-nova-lite", arn, "us-west-2")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST


def test_the_readme_snippet_creates_an_application_profile(base_url):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    snippet = re.search(r"<<'PY'\n(.*?)^PY$", readme, re.S | re.M).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace("http://127.0.0.1:8080", base_url), {})  # the README's own snippet, against this server
    assert "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/" in printed.getvalue()


def test_another_accounts_profile_is_refused_at_registration(app):
    refused = register(app, "foreign", US_NOVA_2_LITE.replace("123456789012", "999999999999"))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == "INVALID_REQUEST"


def test_a_registered_application_profile_prices_usage_after_a_restart(tmp_path):
    settings = {"LOCAL_PERSIST": "on", "LOCAL_STATE_DIR": str(tmp_path / "state")}
    with local_server(tmp_path, KEY, **settings) as url:
        app = provision(url)
        arn = bedrock(url).create_inference_profile(inferenceProfileName="kept",
                                                    modelSource={"copyFrom": US_NOVA_2_LITE})["inferenceProfileArn"]
        assert register(app, "kept", arn).status_code == 201
    with local_server(tmp_path, KEY, **settings) as url:  # resolves the profile afresh
        accepted = report(app.at(url), "kept", arn, "us-east-2")
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST
