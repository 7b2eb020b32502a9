"""A usage record's ``bedrock_model_id`` must name its label's model: a
report on ``economy`` naming Nova Pro or an Opus model is 400 with both ids, and nothing is
written; every form a legitimate client may send (the model id, its cross-Region profile
ids and ARNs, a profile's ARN or any of its models) is accepted. Handlers on moto; the
local stack's Bedrock stand-in for profiles."""

from __future__ import annotations

import pytest

from tests.conftest import assert_error
from tests.test_profiles import bedrock, register, stub_bedrock  # noqa: F401 - bedrock: the stand-in fixture
from tests.usage_support import dedup_items, new_tenant, shard_items, usage_body

NOVA_PRO = "amazon.nova-pro-v1:0"
NOVA_MICRO = "amazon.nova-micro-v1:0"
OPUS = "anthropic.claude-opus-4-1-20250805-v1:0"
APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"


@pytest.fixture
def tenant(api):
    return new_tenant()


def post(api, tenant, **fields):
    return api.post(tenant.app_path + "/usage", usage_body(**fields), token=tenant.token)


@pytest.mark.parametrize("reported", [NOVA_PRO, OPUS, f"us.{OPUS}", "whatever-was-called"])
def test_a_record_naming_another_model_than_its_labels_is_400_with_both_ids(api, tenant, reported):
    body = assert_error(post(api, tenant, model_label="economy", bedrock_model_id=reported), 400, "INVALID_REQUEST")
    assert body["message"] == "bedrock_model_id is not a model of model_label economy"
    assert body["details"] == {
        "model_label": "economy",
        "bedrock_model_id": reported,
        "label_bedrock_model_id": NOVA_MICRO,
        "label_model_ids": [NOVA_MICRO],
    }
    assert shard_items() == [] and dedup_items() == []


@pytest.mark.parametrize(
    "reported",
    [
        NOVA_MICRO,
        f"us.{NOVA_MICRO}",
        f"eu.{NOVA_MICRO}",
        f"apac.{NOVA_MICRO}",
        f"global.{NOVA_MICRO}",
        f"arn:aws:bedrock:us-east-1::foundation-model/{NOVA_MICRO}",
        f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.{NOVA_MICRO}",
    ],
)
def test_the_labels_model_is_accepted_in_every_form_bedrock_takes(api, tenant, reported):
    reply = post(api, tenant, model_label="economy", bedrock_model_id=reported)
    assert reply.status == 202, reply


def test_a_batch_refuses_only_the_mismatched_record(api, tenant):
    records = [
        usage_body(model_label="economy"),
        usage_body(model_label="economy", bedrock_model_id=OPUS),
        usage_body(model_label="premium"),
    ]
    reply = api.post(tenant.app_path + "/usage/batch", {"requests": records}, token=tenant.token)
    assert reply.status == 207, reply
    assert [(r["status"], r.get("error")) for r in reply.json()["results"]] == [
        ("accepted", None),
        ("failed", "INVALID_REQUEST"),
        ("accepted", None),
    ]


def test_a_profile_label_accepts_its_arn_and_each_of_its_models(api, tenant, monkeypatch):
    stub_bedrock(monkeypatch, {"us-east-1": NOVA_PRO, "us-west-2": NOVA_MICRO}, arn=APP_PROFILE)
    assert register(api, tenant, "tenant-a", arn=APP_PROFILE).status == 201
    for reported in (APP_PROFILE, NOVA_PRO, NOVA_MICRO, f"us.{NOVA_MICRO}"):
        reply = post(api, tenant, model_label="tenant-a", calling_region="us-east-1", bedrock_model_id=reported)
        assert reply.status == 202, (reported, reply)
        assert reply.json()["processing"]["cost_usd_micros"] == 3760  # priced for us-east-1's model: Nova Pro
    body = assert_error(
        post(api, tenant, model_label="tenant-a", calling_region="us-east-1", bedrock_model_id=OPUS),
        400,
        "INVALID_REQUEST",
    )
    assert body["details"] == {
        "model_label": "tenant-a",
        "bedrock_model_id": OPUS,
        "label_bedrock_model_id": APP_PROFILE,
        "label_model_ids": [NOVA_PRO, NOVA_MICRO],
    }
    assert len(shard_items()) >= 1 and len(dedup_items()) == 4


def test_a_system_profiles_id_is_accepted_for_it(api, tenant):
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
    assert register(api, tenant, "tenant-a", arn=arn).status == 201
    for reported in (arn, "us.amazon.nova-pro-v1:0", NOVA_PRO):
        reply = post(api, tenant, model_label="tenant-a", calling_region="us-west-2", bedrock_model_id=reported)
        assert reply.status == 202, (reported, reply)
