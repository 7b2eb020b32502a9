"""End to end over real HTTP: the local server (``python -m local``) in a subprocess resolves
inference profiles with its Bedrock stand-in. Register a system-defined profile of the
local account and report usage on it; create an application profile through the server's
Bedrock endpoint with boto3 and do the same; another account's profile is refused.
A registered application profile still prices usage after a restart of a persistent
local stack. Each usage reply names the profile's kind (``pricing.profile_kind``), and a
profile routing to a model outside config.yaml is counted at the estimate with an
``UNPRICED_MODEL`` alert."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import NamedTuple

import boto3
import pytest
import requests

from tests.local_server import local_server, module_server
from tests.tenants import new_tenant
from tests.usage_support import usage_body

KEY = "e2e-profiles-provisioning-key"
US_NOVA_2_LITE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-2-lite-v1:0"
GLOBAL_NOVA_2_LITE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.amazon.nova-2-lite-v1:0"
US_LLAMA = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-3-70b-instruct-v1:0"
QUOTAS = {"standard": 1_000_000}
NOVA_2_LITE_COST = 330 + 1375  # 1,000 input x 0.33 + 500 output x 2.75 USD per 1M (config.yaml "standard")

pytestmark = pytest.mark.e2e


base_url = module_server(KEY)


class App(NamedTuple):
    base_url: str
    path: str
    bearer: dict
    org_bearer: dict

    def at(self, base_url: str) -> App:
        """The same app on a restarted server (another port)."""
        return self._replace(base_url=base_url)

    def post(self, resource: str, body: dict) -> requests.Response:
        return requests.post(f"{self.base_url}{self.path}/{resource}", json=body, headers=self.bearer, timeout=10)


@pytest.fixture(scope="module")
def app(base_url) -> App:
    return provision(base_url)


def provision(base_url: str) -> App:
    """A new org and its app "web", with the app's access token."""
    tenant = new_tenant(base_url, KEY, {"web": {"app_name": "Web"}}, model_ordering=["standard"], quotas=QUOTAS)
    path = tenant.app_path("web").removeprefix(base_url)
    return App(base_url, path, tenant.bearer("web"), tenant.bearer())


def register(app: App, label: str, arn: str) -> requests.Response:
    return app.post("inference-profiles", {"profile_label": label, "inference_profile_arn": arn})


def report(app: App, label: str, arn: str, region: str) -> requests.Response:
    fields = {"model_label": label, "bedrock_model_id": arn, "calling_region": region}
    return app.post("usage", usage_body(**fields, input_tokens=1000, output_tokens=500))


def bedrock(base_url: str):
    """A developer's boto3 Bedrock client of the local stack."""
    return boto3.client(
        "bedrock",
        region_name="us-east-1",
        endpoint_url=base_url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def test_usage_on_a_system_defined_profile_of_the_local_account(app):
    assert register(app, "nova-lite-us", US_NOVA_2_LITE).status_code == 201
    accepted = report(app, "nova-lite-us", US_NOVA_2_LITE, "us-east-1")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST
    assert accepted.json()["pricing"]["profile_kind"] == "GEOGRAPHIC"


@pytest.mark.parametrize("calling_region", ["us-east-1", "eu-west-1"])
def test_usage_on_a_global_profile_is_priced_as_global_from_any_region(app, calling_region):
    label = f"nova-lite-global-{calling_region}"
    assert register(app, label, GLOBAL_NOVA_2_LITE).status_code == 201
    accepted = report(app, label, GLOBAL_NOVA_2_LITE, calling_region)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["pricing"]["profile_kind"] == "GLOBAL"
    # no global rate on the local stack (no Price List): priced as in-region, never under-counted
    assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST


def test_usage_on_a_model_outside_the_config_is_counted_at_the_estimate(app):
    assert register(app, "llama-us", US_LLAMA).status_code == 201
    accepted = report(app, "llama-us", US_LLAMA, "us-west-2")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["pricing"]["source"] == "ESTIMATE"
    assert accepted.json()["pricing"]["profile_kind"] == "GEOGRAPHIC"
    # at least Claude Opus's price (config.yaml's floor), not the highest Nova label's: 20x more
    assert accepted.json()["processing"]["cost_usd_micros"] == 1000 * 15_000_000 // 10**6 + 500 * 75_000_000 // 10**6
    org_path = app.path.rsplit("/apps/", 1)[0]
    alerts = requests.get(f"{app.base_url}{org_path}/alerts", headers=app.org_bearer, timeout=10)
    assert alerts.status_code == 200, alerts.text
    assert [(a["type"], a["label"], a["model_id"]) for a in alerts.json()["alerts"]] == [
        ("UNPRICED_MODEL", "llama-us", "meta.llama3-3-70b-instruct-v1:0")
    ]


def test_usage_on_an_application_profile_created_through_the_local_server(base_url, app):
    arn = bedrock(base_url).create_inference_profile(
        inferenceProfileName="web-nova-lite", modelSource={"copyFrom": US_NOVA_2_LITE}
    )["inferenceProfileArn"]
    assert arn.startswith("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/")
    assert register(app, "web-nova-lite", arn).status_code == 201
    accepted = report(app, "web-nova-lite", arn, "us-west-2")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST


def test_an_application_profile_is_its_first_orgs_another_org_is_refused(base_url, app):
    """Every tenant's application profiles live in the service's one account, so the first
    org to register one owns it: another org's registration of the same ARN is a 409, and
    its usage on that ARN is refused, not priced."""
    arn = bedrock(base_url).create_inference_profile(
        inferenceProfileName="owned-nova-lite", modelSource={"copyFrom": US_NOVA_2_LITE}
    )["inferenceProfileArn"]
    assert register(app, "owned", arn).status_code == 201
    other = provision(base_url)
    refused = register(other, "owned", arn)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "ALREADY_EXISTS"
    assert refused.json()["details"]["reason"] == "profile_of_another_org"
    unregistered = report(other, "owned", arn, "us-east-1")
    assert unregistered.status_code == 400, unregistered.text
    assert report(app, "owned", arn, "us-east-1").status_code == 202


def test_the_tutorials_snippet_creates_an_application_profile(base_url):
    tutorial = (Path(__file__).resolve().parent.parent / "docs" / "tutorial.md").read_text()
    snippet = re.search(r"<<'PY'\n(.*?)^PY$", tutorial, re.S | re.M).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace("http://127.0.0.1:8080", base_url), {})  # the tutorial's own snippet, against this server
    assert "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/" in printed.getvalue()


def test_another_accounts_profile_is_refused_at_registration(app):
    refused = register(app, "foreign", US_NOVA_2_LITE.replace("123456789012", "999999999999"))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == "INVALID_REQUEST"


def test_an_app_cannot_bill_a_config_label_at_a_cheaper_profiles_price(app):
    """Config labels resolve without a profile lookup because no profile can take one: an
    app registering a Nova Lite profile as "premium" (Nova Pro) is refused, and reporting
    "premium" usage as Nova Lite calls is refused as the wrong model, not priced as Lite."""
    refused = register(app, "premium", US_NOVA_2_LITE)
    assert refused.status_code == 409, refused.text
    assert refused.json()["details"]["reason"] == "config_label"
    mismatched = report(app, "premium", US_NOVA_2_LITE, "us-east-1")
    assert mismatched.status_code == 400, mismatched.text


def test_a_registered_application_profile_prices_usage_after_a_restart(tmp_path):
    settings = {"LOCAL_PERSIST": "on", "LOCAL_STATE_DIR": str(tmp_path / "state")}
    with local_server(tmp_path, KEY, **settings) as url:
        app = provision(url)
        arn = bedrock(url).create_inference_profile(
            inferenceProfileName="kept", modelSource={"copyFrom": US_NOVA_2_LITE}
        )["inferenceProfileArn"]
        assert register(app, "kept", arn).status_code == 201
    with local_server(tmp_path, KEY, **settings) as url:  # resolves the profile afresh
        accepted = report(app.at(url), "kept", arn, "us-east-2")
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["processing"]["cost_usd_micros"] == NOVA_2_LITE_COST


def test_a_profile_label_is_1_to_50_characters_and_a_longer_one_writes_nothing(app):
    """api_spec.md: "Label to use for this profile (1-50 chars)"; 51 characters was registered (201).
    Refused with the error schema, the label is then no label of the app's: usage under it is 400."""
    too_long, longest = "p" * 51, "q" * 50
    refused = register(app, too_long, US_NOVA_2_LITE)
    assert refused.status_code == 400, refused.text
    assert {"error", "message", "timestamp"} <= set(refused.json()) and refused.json()["error"] == "INVALID_REQUEST"
    assert report(app, too_long, US_NOVA_2_LITE, "us-east-1").status_code == 400  # nothing was registered
    assert register(app, longest, US_NOVA_2_LITE).status_code == 201
    assert report(app, longest, US_NOVA_2_LITE, "us-east-1").status_code == 202
