"""End to end over real HTTP against ``python -m local``: the pricing items of the second outside review, as a
client that misreports (or an attacker) would try them: a made-up region in a profile ARN
or a calling region (item 6), a record naming another model than its label's (item 2)."""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.local_server import module_server
from tests.tenants import new_tenant
from tests.usage_support import usage_body

KEY = "e2e-pricing-provisioning-key"
QUOTAS = {"premium": 5_000_000, "standard": 5_000_000, "economy": 5_000_000}
LOCAL_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-2-lite-v1:0"

pytestmark = pytest.mark.e2e


base_url = module_server(KEY)


class Tenant:
    """An org with one app "web" and its token, over HTTP."""

    def __init__(self, base_url: str):
        tenant = new_tenant(base_url, KEY, {"web": {"app_name": "Web"}}, quotas=QUOTAS)
        self.app_path, self.bearer = tenant.app_path("web"), tenant.bearer("web")

    def register(self, label: str, arn: str) -> requests.Response:
        body = {"profile_label": label, "inference_profile_arn": arn}
        return requests.post(f"{self.app_path}/inference-profiles", headers=self.bearer, json=body, timeout=10)

    def usage(self, **fields) -> requests.Response:
        body = usage_body(**{"input_tokens": 1000, "output_tokens": 500, **fields})
        return requests.post(f"{self.app_path}/usage", headers=self.bearer, json=body, timeout=10)


@pytest.fixture
def tenant(base_url):
    return Tenant(base_url)


def test_a_profile_arn_naming_a_made_up_region_is_400(tenant):
    for region in ("zz-aaaa-1", "zz-aaab-1", "us-nowhere-9"):
        reply = tenant.register(
            "p1", f"arn:aws:bedrock:{region}:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
        )
        assert reply.status_code == 400, reply.text
        assert reply.json()["message"] == f"Invalid inference profile ARN: unknown AWS region {region}"
    assert tenant.register("p1", LOCAL_PROFILE).status_code == 201  # a real one still registers


def test_usage_naming_a_made_up_calling_region_is_400(tenant):
    reply = tenant.usage(calling_region="zz-aaaa-1")
    assert reply.status_code == 400, reply.text
    assert reply.json()["details"] == {"calling_region": "zz-aaaa-1"}
    assert tenant.usage(calling_region="eu-west-1").status_code == 202


def test_a_report_naming_a_costlier_model_than_its_label_is_400_with_both_ids(tenant):
    request_id = str(uuid.uuid4())
    for reported in ("amazon.nova-pro-v1:0", "anthropic.claude-opus-4-1-20250805-v1:0"):
        reply = tenant.usage(request_id=request_id, model_label="economy", bedrock_model_id=reported)
        assert reply.status_code == 400, reply.text
        details = reply.json()["details"]
        assert (details["bedrock_model_id"], details["label_bedrock_model_id"]) == (reported, "amazon.nova-micro-v1:0")
    honest = tenant.usage(request_id=request_id, model_label="economy", bedrock_model_id="amazon.nova-micro-v1:0")
    assert honest.status_code == 202 and honest.json()["duplicate"] is False  # the refused ones wrote nothing


def test_what_selection_names_and_the_cross_region_forms_are_accepted(tenant):
    assert tenant.register("my-lite", LOCAL_PROFILE).status_code == 201
    choice = requests.get(f"{tenant.app_path}/model-selection", headers=tenant.bearer, timeout=10).json()
    label, model = choice["recommended_model"]["label"], choice["recommended_model"]["bedrock_model_id"]
    assert tenant.usage(model_label=label, bedrock_model_id=model).status_code == 202
    for reported in ("us.amazon.nova-pro-v1:0", "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"):
        assert tenant.usage(bedrock_model_id=reported).status_code == 202
    for reported in (LOCAL_PROFILE, "amazon.nova-2-lite-v1:0"):
        reply = tenant.usage(model_label="my-lite", bedrock_model_id=reported, calling_region="us-east-1")
        assert reply.status_code == 202, reply.text
