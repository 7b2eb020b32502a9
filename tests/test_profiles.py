"""Inference profiles: registration (moto) and usage on a profile label. moto has no
Bedrock GetInferenceProfile: the local stack's stand-in answers it (over HTTP, as on
``make run``), and a botocore Stubber where a test needs a routing or a failure no real
profile has."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from price_keeper import state
from price_keeper.aws import bedrock as bedrock_control_plane
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_date
from tests.conftest import assert_error, keys_asked, profile_reads
from tests.factories import seed_app, seed_profiles, token_for
from tests.usage_support import new_tenant, shard_items, usage_body

ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
FOREIGN_ARN = ARN.replace("123456789012", "999999999999")


def register(
    api,
    tenant,
    label: str,
    arn: str = ARN,
    description: str | None = "Premium profile for Tenant A",
    token: str | None = None,
):
    body = {"profile_label": label, "inference_profile_arn": arn}
    if description is not None:
        body["description"] = description
    return api.post(tenant.app_path + "/inference-profiles", body, token=token or tenant.token)


@pytest.fixture(autouse=True)
def bedrock(aws, bedrock_endpoint):
    """The functions resolve profiles with the local stack's stand-in; a client of it for
    the test (e.g. to create application profiles)."""
    return lambda region="us-east-1": boto3.client("bedrock", region_name=region, endpoint_url=bedrock_endpoint)


def stub_bedrock(monkeypatch, routing: dict[str, str], arn: str = ARN, error: str | None = None) -> Stubber:
    """Bedrock answering one GetInferenceProfile for ``arn`` with ``routing`` (region -> model id);
    stub before registering: registration resolves the profile and memoizes the answer."""
    client = boto3.client("bedrock", region_name="us-east-1")
    stubber = Stubber(client)
    expected = {"inferenceProfileIdentifier": arn}
    if error:
        stubber.add_client_error("get_inference_profile", error, "stubbed failure", 400, expected_params=expected)
    else:
        stubber.add_response(
            "get_inference_profile",
            {
                "inferenceProfileName": "tenant-a",
                "inferenceProfileArn": arn,
                "inferenceProfileId": arn.rsplit("/", 1)[1],
                "status": "ACTIVE",
                "type": "APPLICATION" if "application-inference-profile" in arn else "SYSTEM_DEFINED",
                "createdAt": datetime(2026, 1, 1, tzinfo=UTC),
                "updatedAt": datetime(2026, 1, 1, tzinfo=UTC),
                "models": [
                    {"modelArn": f"arn:aws:bedrock:{region}::foundation-model/{model}"}
                    for region, model in routing.items()
                ],
            },
            expected,
        )
    stubber.activate()
    monkeypatch.setattr(bedrock_control_plane, "bedrock_client", lambda region: client)
    return stubber


@pytest.fixture
def tenant(api):
    return new_tenant()


def test_registration_answers_201_and_stores_the_seed_item(api, tenant):
    reply = register(api, tenant, "tenant-a-premium")
    assert reply.status == 201, reply
    body = reply.json()
    assert set(body) == {"profile_label", "inference_profile_arn", "status", "description", "created_at"}
    assert (body["profile_label"], body["inference_profile_arn"], body["status"]) == (
        "tenant-a-premium",
        ARN,
        "registered",
    )
    assert body["created_at"].endswith("Z")
    item = table(tables.CONFIG).get_item(
        Key={"org_key": keys.profile_org_key(tenant.org_id, tenant.app_id), "resource_key": "PROFILE#tenant-a-premium"}
    )["Item"]
    assert item["inference_profile_arn"] == ARN and item["created_at"] == body["created_at"]
    assert item["description"] == "Premium profile for Tenant A" and "updated_at_epoch" in item


def test_description_is_optional(api, tenant):
    reply = register(api, tenant, "no-description", description=None)
    assert reply.status == 201 and "description" not in reply.json()


def test_a_label_registers_once(api, tenant):
    first = register(api, tenant, "tenant-a")
    body = assert_error(
        register(api, tenant, "tenant-a", arn=ARN.replace("nova-pro", "nova-micro")), 409, "ALREADY_EXISTS"
    )
    assert body["details"]["registered_at"] == first.json()["created_at"]


def test_a_config_label_cannot_become_a_profile(api, tenant):
    assert_error(register(api, tenant, "premium"), 409, "ALREADY_EXISTS")


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20241022-v2:0",
        "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/global.amazon.nova-2-lite-v1:0",
        "arn:aws-us-gov:bedrock:us-gov-west-1:123456789012:inference-profile/us-gov.amazon.nova-pro-v1:0",
    ],
)
def test_system_profile_arns_of_every_aws_partition_are_accepted(api, tenant, arn):
    assert register(api, tenant, "p1", arn=arn).status == 201


@pytest.mark.parametrize(
    "region, model_arn",
    [
        ("eu-west-1", "arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0"),
        ("cn-north-1", "arn:aws-cn:bedrock:cn-north-1::foundation-model/amazon.nova-pro-v1:0"),
    ],
)
def test_application_profile_arns_are_accepted(api, tenant, bedrock, region, model_arn):
    arn = bedrock(region).create_inference_profile(
        inferenceProfileName="tenant-a", modelSource={"copyFrom": model_arn}
    )["inferenceProfileArn"]
    assert ":application-inference-profile/" in arn
    assert register(api, tenant, "p1", arn=arn).status == 201


def test_an_application_profile_is_one_orgs_another_org_cannot_register_it(api, tenant, bedrock):
    """Every tenant's application profiles live in the service's one account: the first org
    to register one owns it; another org's registration is 409, so it can neither take the
    owner's reconciliation alerts nor be sent the owner's spend (red-team note). The
    owner's other apps may register it too."""
    arn = bedrock("us-east-1").create_inference_profile(
        inferenceProfileName="tenant-a",
        modelSource={"copyFrom": "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"},
    )["inferenceProfileArn"]
    assert register(api, tenant, "mine", arn=arn).status == 201
    other = new_tenant()
    taken = assert_error(register(api, other, "theirs", arn=arn), 409, "ALREADY_EXISTS")
    assert taken["details"] == {"profile_label": "theirs", "reason": "profile_of_another_org"}
    assert stored_profile(other, "theirs") is None
    seed_app(tenant.org_id, "app-2")
    sibling = SimpleNamespace(app_path=f"/api/v1/orgs/{tenant.org_id}/apps/app-2")
    assert register(api, sibling, "ours", arn=arn, token=token_for(tenant.org_id, "app-2")).status == 201
    assert register(api, tenant, "system", arn=ARN).status == 201  # a system profile is everyone's
    assert register(api, other, "system", arn=ARN).status == 201


def stored_profile(tenant, label: str) -> dict | None:
    return (
        table(tables.CONFIG)
        .get_item(
            Key={"org_key": keys.profile_org_key(tenant.org_id, tenant.app_id), "resource_key": f"PROFILE#{label}"}
        )
        .get("Item")
    )


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",  # never created
        "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0",  # not offered there
    ],
)
def test_a_profile_bedrock_does_not_know_is_refused_at_registration(api, tenant, arn):
    body = assert_error(register(api, tenant, "p1", arn=arn), 400, "INVALID_REQUEST")
    assert body["message"] == "Inference profile not found in AWS Bedrock"
    assert stored_profile(tenant, "p1") is None


def test_another_accounts_profile_is_refused_at_registration(api, tenant):
    body = assert_error(register(api, tenant, "p1", arn=FOREIGN_ARN), 400, "INVALID_REQUEST")
    assert "account" in body["message"] and body["details"] == {"inference_profile_arn": FOREIGN_ARN}
    assert stored_profile(tenant, "p1") is None


def test_bedrock_failing_at_registration_is_a_retryable_503_and_nothing_is_stored(api, tenant, monkeypatch):
    stub_bedrock(monkeypatch, {}, error="ThrottlingException")
    reply = register(api, tenant, "p1")
    assert_error(reply, 503, "SERVICE_UNAVAILABLE")
    assert reply.headers["retry-after"] == "1"
    assert stored_profile(tenant, "p1") is None


@pytest.mark.parametrize(
    "arn",
    [
        "not-a-valid-arn",
        "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0",
        "arn:aws:s3:us-east-1:123456789012:inference-profile/abc",
        "arn:aws-foo:bedrock:us-east-1:123456789012:inference-profile/abc",
        "arn:aws:bedrock:us-east-1:12345678901:inference-profile/abc",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/",
        "arn:aws:bedrock:US-EAST-1:123456789012:inference-profile/abc",
        ARN + " ",
    ],
)
def test_anything_else_is_400(api, tenant, arn):
    body = assert_error(register(api, tenant, "p1", arn=arn), 400, "INVALID_REQUEST")
    assert body["message"].startswith("Invalid inference profile ARN")
    assert stored_profile(tenant, "p1") is None


@pytest.mark.parametrize(
    "body",
    [
        {"profile_label": "has#hash", "inference_profile_arn": ARN},
        {"profile_label": "x" * 65, "inference_profile_arn": ARN},
        {"profile_label": "ok"},
        {"profile_label": "ok", "inference_profile_arn": ARN, "unexpected": 1},
        {"profile_label": "ok", "inference_profile_arn": ARN, "description": "d" * 501},
    ],
)
def test_malformed_bodies_are_400(api, tenant, body):
    assert_error(api.post(tenant.app_path + "/inference-profiles", body, token=tenant.token), 400, "INVALID_REQUEST")


def test_registration_needs_the_apps_token(api, tenant):
    anonymous = api.post(tenant.app_path + "/inference-profiles", {"profile_label": "p", "inference_profile_arn": ARN})
    assert_error(anonymous, 401, "UNAUTHORIZED")
    other = new_tenant()
    assert_error(register(api, tenant, "p", token=other.token), 403, "FORBIDDEN")
    assert_error(register(api, tenant, "p", token=token_for(tenant.org_id, "another-app")), 403, "FORBIDDEN")


def test_an_unregistered_app_is_404(api, tenant):
    token = token_for(tenant.org_id, "ghost-app")
    reply = api.post(
        f"/api/v1/orgs/{tenant.org_id}/apps/ghost-app/inference-profiles",
        {"profile_label": "p", "inference_profile_arn": ARN},
        token=token,
    )
    assert_error(reply, 404, "NOT_FOUND")


# --- usage on a profile label ------------------------------------------------------


def test_profile_usage_needs_calling_region(api, tenant):
    register(api, tenant, "tenant-a-premium")
    body = assert_error(
        api.post(tenant.app_path + "/usage", usage_body(model_label="tenant-a-premium"), token=tenant.token),
        400,
        "INVALID_REQUEST",
    )
    assert body["message"] == "calling_region is required when using inference profile label: tenant-a-premium"
    assert body["details"] == {"model_label": "tenant-a-premium", "label_type": "profile"}
    assert shard_items() == []


def test_profile_usage_is_priced_for_the_model_serving_the_calling_region(api, tenant, monkeypatch):
    stubber = stub_bedrock(monkeypatch, {"us-east-1": "amazon.nova-pro-v1:0", "us-west-2": "amazon.nova-micro-v1:0"})
    register(api, tenant, "tenant-a-premium")
    east = api.post(
        tenant.app_path + "/usage",
        usage_body(model_label="tenant-a-premium", calling_region="us-east-1"),
        token=tenant.token,
    )
    assert east.status == 202, east
    assert east.json()["processing"]["cost_usd_micros"] == 3760  # Nova Pro: 1500 x 0.80 + 800 x 3.20 per 1M
    west = api.post(
        tenant.app_path + "/usage",
        usage_body(model_label="tenant-a-premium", calling_region="us-west-2"),
        token=tenant.token,
    )
    assert west.json()["processing"]["cost_usd_micros"] == 165  # Nova Micro: 52.5 + 112 -> 164.5, rounded up
    stubber.assert_no_pending_responses()  # one GetInferenceProfile for registration and both: memoized
    assert {item["shard_key"].split("#LABEL#")[1].split("#SH#")[0] for item in shard_items()} == {"tenant-a-premium"}


def test_a_region_the_profile_does_not_serve_is_400(api, tenant):
    register(api, tenant, "tenant-a")  # us.amazon.nova-pro-v1:0: us-east-1, us-east-2, us-west-2
    reply = api.post(
        tenant.app_path + "/usage", usage_body(model_label="tenant-a", calling_region="eu-west-1"), token=tenant.token
    )
    body = assert_error(reply, 400, "INVALID_REQUEST")
    assert body["details"]["profile_regions"] == ["us-east-1", "us-east-2", "us-west-2"]


def test_usage_on_a_system_profile_is_priced_for_its_model(api, tenant):
    register(api, tenant, "tenant-a")
    reply = api.post(
        tenant.app_path + "/usage", usage_body(model_label="tenant-a", calling_region="us-west-2"), token=tenant.token
    )
    assert reply.status == 202, reply
    assert reply.json()["processing"]["cost_usd_micros"] == 3760  # Nova Pro at config prices


def resolved_elsewhere() -> None:
    """As in another container: nothing memoized, the next usage asks Bedrock again."""
    state.reset()


@pytest.mark.parametrize("error", ["ResourceNotFoundException", "AccessDeniedException"])
def test_a_registered_profile_bedrock_no_longer_shows_is_400_not_a_retry_loop(api, tenant, monkeypatch, error):
    register(api, tenant, "tenant-a")
    resolved_elsewhere()
    stub_bedrock(monkeypatch, {}, error=error)  # deleted since, or registered before the account check
    assert_error(
        api.post(
            tenant.app_path + "/usage",
            usage_body(model_label="tenant-a", calling_region="us-east-1"),
            token=tenant.token,
        ),
        400,
        "INVALID_REQUEST",
    )
    assert shard_items() == []


def test_bedrock_failing_is_a_retryable_503_and_nothing_is_written(api, tenant, monkeypatch):
    register(api, tenant, "tenant-a")
    resolved_elsewhere()
    stub_bedrock(monkeypatch, {}, error="InternalServerException")
    reply = api.post(
        tenant.app_path + "/usage", usage_body(model_label="tenant-a", calling_region="us-east-1"), token=tenant.token
    )
    assert_error(reply, 503, "SERVICE_UNAVAILABLE")
    assert reply.headers["retry-after"] == "1"
    assert shard_items() == []


def test_a_profile_label_can_lead_the_model_ordering(api):
    tenant = new_tenant(
        app_overrides={
            "model_ordering": ["tenant-a", "premium"],
            "quotas": {"tenant-a": 1_000_000, "premium": 1_000_000},
        }
    )
    register(api, tenant, "tenant-a")
    reply = api.get(tenant.app_path + "/model-selection", token=tenant.token)
    assert reply.status == 200, reply
    recommended = reply.json()["recommended_model"]
    assert (recommended["label"], recommended["bedrock_model_id"]) == ("tenant-a", ARN)
    assert reply.json()["pricing"]["input_price_usd_micros_per_1m"] == 800_000


# --- profile kinds -----------------------------------------------------------------


def profile_arn(region: str, profile_id: str, partition: str = "aws") -> str:
    return f"arn:{partition}:bedrock:{region}:123456789012:inference-profile/{profile_id}"


@pytest.mark.parametrize(
    "arn, calling_region, kind",
    [
        (profile_arn("us-east-1", "us.amazon.nova-pro-v1:0"), "us-west-2", "GEOGRAPHIC"),
        (profile_arn("eu-west-1", "eu.amazon.nova-pro-v1:0"), "eu-central-1", "GEOGRAPHIC"),
        (profile_arn("ap-south-1", "apac.amazon.nova-pro-v1:0"), "ap-southeast-1", "GEOGRAPHIC"),
        (profile_arn("ap-northeast-1", "jp.amazon.nova-pro-v1:0"), "ap-northeast-3", "GEOGRAPHIC"),
        (profile_arn("ap-southeast-2", "au.amazon.nova-pro-v1:0"), "ap-southeast-4", "GEOGRAPHIC"),
        (profile_arn("ca-central-1", "ca.amazon.nova-pro-v1:0"), "ca-west-1", "GEOGRAPHIC"),
        (profile_arn("us-gov-west-1", "us-gov.amazon.nova-pro-v1:0", "aws-us-gov"), "us-gov-east-1", "GEOGRAPHIC"),
        # a global profile answers its model without a Region: it serves every calling Region
        (profile_arn("us-east-1", "global.amazon.nova-pro-v1:0"), "us-east-1", "GLOBAL"),
        (profile_arn("us-east-1", "global.amazon.nova-pro-v1:0"), "eu-west-1", "GLOBAL"),
    ],
)
def test_a_system_profiles_kind_comes_from_its_id(api, tenant, arn, calling_region, kind):
    assert register(api, tenant, "p1", arn=arn).status == 201
    reply = api.post(
        tenant.app_path + "/usage", usage_body(model_label="p1", calling_region=calling_region), token=tenant.token
    )
    assert reply.status == 202, reply
    assert reply.json()["pricing"]["profile_kind"] == kind
    assert reply.json()["processing"]["cost_usd_micros"] == 3760  # Nova Pro at config prices (no kind price)


@pytest.mark.parametrize(
    "copy_from, calling_region, kind",
    [
        (profile_arn("us-east-1", "global.amazon.nova-pro-v1:0"), "us-east-1", "GLOBAL"),
        (profile_arn("us-east-1", "us.amazon.nova-pro-v1:0"), "us-east-2", "GEOGRAPHIC"),
        ("arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0", "us-east-1", "IN_REGION"),
    ],
)
def test_an_application_profile_has_the_kind_of_what_it_copies(api, tenant, bedrock, copy_from, calling_region, kind):
    arn = bedrock().create_inference_profile(inferenceProfileName="copy", modelSource={"copyFrom": copy_from})[
        "inferenceProfileArn"
    ]
    assert register(api, tenant, "p1", arn=arn).status == 201
    reply = api.post(
        tenant.app_path + "/usage", usage_body(model_label="p1", calling_region=calling_region), token=tenant.token
    )
    assert reply.status == 202, reply
    assert reply.json()["pricing"]["profile_kind"] == kind


def test_a_foundation_model_label_is_in_region(api, tenant):
    reply = api.post(tenant.app_path + "/usage", usage_body(calling_region="us-east-1"), token=tenant.token)
    assert reply.json()["pricing"]["profile_kind"] == "IN_REGION"


def test_a_global_profile_is_priced_at_the_global_rate_of_the_calling_region(api, tenant):
    today = org_date("America/New_York").isoformat()
    table(tables.PRICING_CACHE).put_item(
        Item={
            "model_id": "amazon.nova-pro-v1:0",
            "price_key": f"{today}#eu-west-1",
            "input_price_usd_micros_per_1m": 1_050_000,
            "output_price_usd_micros_per_1m": 4_200_000,
            "global_input_price_usd_micros_per_1m": 720_000,
            "global_output_price_usd_micros_per_1m": 2_880_000,
        }
    )
    for label, profile_id in (("nova-global", "global.amazon.nova-pro-v1:0"), ("nova-eu", "eu.amazon.nova-pro-v1:0")):
        assert register(api, tenant, label, arn=profile_arn("eu-west-1", profile_id)).status == 201
    body = usage_body(model_label="nova-global", calling_region="eu-west-1", input_tokens=1000, output_tokens=1000)
    global_reply = api.post(tenant.app_path + "/usage", body, token=tenant.token).json()
    assert (global_reply["pricing"]["source"], global_reply["pricing"]["profile_kind"]) == ("PRICING_API", "GLOBAL")
    assert global_reply["processing"]["cost_usd_micros"] == 720 + 2880
    # a geographic profile has no rate of its own here: the Region's in-region rate
    geo_body = {**body, "model_label": "nova-eu", "request_id": str(uuid.uuid4())}
    geo_reply = api.post(tenant.app_path + "/usage", geo_body, token=tenant.token).json()
    assert geo_reply["pricing"]["profile_kind"] == "GEOGRAPHIC"
    assert geo_reply["processing"]["cost_usd_micros"] == 1050 + 4200


def test_a_retry_answers_with_the_first_acceptances_kind(api, tenant):
    register(api, tenant, "nova-global", arn=profile_arn("us-east-1", "global.amazon.nova-pro-v1:0"))
    body = usage_body(model_label="nova-global", calling_region="us-east-1")
    api.post(tenant.app_path + "/usage", body, token=tenant.token)
    retry = api.post(tenant.app_path + "/usage", body, token=tenant.token).json()
    assert retry["duplicate"] is True and retry["pricing"]["profile_kind"] == "GLOBAL"


def test_a_usage_batch_reads_the_profiles_it_names_together(api, tenant, dynamodb_calls):
    """Red-team note: a batch of 100 records on 100 profile labels read them with 100
    GetItems in a row; one BatchGetItem now, and each record finds its profile cached."""
    labels = [f"tenant-a-{n:03d}" for n in range(100)]
    seed_profiles(tenant.org_id, tenant.app_id, labels, ARN)
    records = [usage_body(model_label=label, calling_region="us-east-1") for label in labels]
    dynamodb_calls.clear()
    reply = api.post(tenant.app_path + "/usage/batch", {"requests": records}, token=tenant.token)
    assert (reply.status, reply.json()["accepted"]) == (207, 100), reply
    assert profile_reads(dynamodb_calls) == ["BatchGetItem"]


def test_a_usage_batch_whose_profile_read_fails_reads_each_records_own(api, tenant, dynamodb_calls):
    """The batch's read of its profiles together is a saving, not a step a record depends
    on: when it fails (the store throttled), each record reads its own, as before."""
    from botocore.exceptions import ClientError

    from price_keeper.store.dynamo import ddb_client

    labels = [f"tenant-b-{n}" for n in range(3)]
    seed_profiles(tenant.org_id, tenant.app_id, labels, ARN)

    def throttle_the_batch_read(params, **_):
        if len(keys_asked("BatchGetItem", params, tables.CONFIG)) == len(labels):
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "BatchGetItem")

    ddb_client().meta.events.register("provide-client-params.dynamodb.BatchGetItem", throttle_the_batch_read)
    records = [usage_body(model_label=label, calling_region="us-east-1") for label in labels]
    dynamodb_calls.clear()
    reply = api.post(tenant.app_path + "/usage/batch", {"requests": records}, token=tenant.token)
    assert reply.status == 207 and reply.json()["accepted"] == 3, reply.json()
    assert profile_reads(dynamodb_calls) == ["BatchGetItem"] * 4  # the batch's (refused), then one a record
