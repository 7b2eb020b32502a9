"""The local stack's Bedrock stand-in (``local/bedrock.py``), called the way the layer and a
developer call it: a real boto3 ``bedrock`` client against the local HTTP server. Every
answer is checked against botocore's own model of the operation's output."""

from __future__ import annotations

import re

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

from local.bedrock import ACCOUNT, InferenceProfiles

NOVA_2_LITE = "amazon.nova-2-lite-v1:0"
US_PROFILE = f"us.{NOVA_2_LITE}"
APPLICATION_ARN = re.compile(r"^arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/[a-z0-9]{12}$")


def bedrock(endpoint: str, region: str = "us-east-1"):
    return boto3.client(
        "bedrock", region_name=region, endpoint_url=endpoint, aws_access_key_id="local", aws_secret_access_key="local"
    )


def get_profile(client, identifier: str) -> dict:
    """GetInferenceProfile, the answer checked against botocore's output shape."""
    answer = client.get_inference_profile(inferenceProfileIdentifier=identifier)
    answer.pop("ResponseMetadata")
    shape = client.meta.service_model.operation_model("GetInferenceProfile").output_shape
    report = ParamValidator().validate(answer, shape)
    assert not report.has_errors(), report.generate_report()
    return answer


def error_code(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return raised.value.response["Error"]["Code"]


def model_arns(answer: dict) -> list[str]:
    return [model["modelArn"] for model in answer["models"]]


# --- system-defined profiles -------------------------------------------------------


def test_a_us_profile_resolves_by_id_as_aws_answers_it(bedrock_endpoint):
    answer = get_profile(bedrock(bedrock_endpoint), US_PROFILE)
    assert answer["inferenceProfileArn"] == f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{US_PROFILE}"
    assert (answer["inferenceProfileId"], answer["type"], answer["status"]) == (US_PROFILE, "SYSTEM_DEFINED", "ACTIVE")
    assert model_arns(answer) == [
        f"arn:aws:bedrock:{region}::foundation-model/{NOVA_2_LITE}"
        for region in ("us-east-1", "us-east-2", "us-west-2")
    ]
    assert answer["inferenceProfileName"] and answer["description"].startswith("Routes requests to")


def test_a_profile_resolves_by_arn_in_the_region_it_names(bedrock_endpoint):
    arn = "arn:aws:bedrock:us-west-2:123456789012:inference-profile/us.meta.llama3-3-70b-instruct-v1:0"
    answer = get_profile(bedrock(bedrock_endpoint), arn)
    assert answer["inferenceProfileArn"] == arn
    assert "arn:aws:bedrock:us-west-2::foundation-model/meta.llama3-3-70b-instruct-v1:0" in model_arns(answer)


@pytest.mark.parametrize(
    "prefix, source, destinations",
    [
        ("eu", "eu-west-1", {"eu-central-1", "eu-west-1", "eu-west-3", "eu-north-1"}),
        ("apac", "ap-northeast-1", {"ap-northeast-1", "ap-southeast-1", "ap-southeast-2", "ap-south-1"}),
        ("jp", "ap-northeast-3", {"ap-northeast-1", "ap-northeast-3"}),
        ("au", "ap-southeast-2", {"ap-southeast-2", "ap-southeast-4"}),
        ("ca", "ca-central-1", {"ca-central-1", "ca-west-1"}),
    ],
)
def test_each_geography_routes_within_its_regions(bedrock_endpoint, prefix, source, destinations):
    answer = get_profile(bedrock(bedrock_endpoint, source), f"{prefix}.anthropic.claude-sonnet-4-5-20250929-v1:0")
    regions = {arn.split(":")[3] for arn in model_arns(answer)}
    assert source in regions and destinations <= regions
    assert all(region.split("-")[0] in {"eu", "ap", "ca"} for region in regions)


def test_a_us_gov_profile_lives_in_the_gov_cloud_partition(bedrock_endpoint):
    answer = get_profile(bedrock(bedrock_endpoint, "us-gov-west-1"), "us-gov.amazon.nova-pro-v1:0")
    assert answer["inferenceProfileArn"].startswith("arn:aws-us-gov:bedrock:us-gov-west-1:123456789012:")
    assert model_arns(answer) == [
        f"arn:aws-us-gov:bedrock:{region}::foundation-model/amazon.nova-pro-v1:0"
        for region in ("us-gov-east-1", "us-gov-west-1")
    ]


def test_a_global_profile_lists_the_region_less_model_and_the_source_region(bedrock_endpoint):
    answer = get_profile(bedrock(bedrock_endpoint, "eu-west-1"), f"global.{NOVA_2_LITE}")
    assert model_arns(answer) == [
        f"arn:aws:bedrock:::foundation-model/{NOVA_2_LITE}",
        f"arn:aws:bedrock:eu-west-1::foundation-model/{NOVA_2_LITE}",
    ]


@pytest.mark.parametrize(
    "region, identifier",
    [
        ("eu-west-1", US_PROFILE),  # a geography's profile is not offered outside it
        ("us-east-1", f"eu.{NOVA_2_LITE}"),
        ("us-gov-west-1", f"global.{NOVA_2_LITE}"),  # global profiles are commercial-partition only
        ("us-east-1", f"xx.{NOVA_2_LITE}"),  # no such geography
        ("us-east-1", NOVA_2_LITE),  # a model id is not a profile
        ("us-east-1", "a1b2c3d4e5f6"),  # no application profile with that id
    ],
)
def test_what_the_account_cannot_see_from_that_region_is_not_found(bedrock_endpoint, region, identifier):
    assert (
        error_code(
            lambda: bedrock(bedrock_endpoint, region).get_inference_profile(inferenceProfileIdentifier=identifier)
        )
        == "ResourceNotFoundException"
    )


@pytest.mark.parametrize(
    "arn",
    [
        f"arn:aws:bedrock:us-east-1:999999999999:inference-profile/{US_PROFILE}",
        "arn:aws:bedrock:us-east-1:999999999999:application-inference-profile/a1b2c3d4e5f6",
    ],
)
def test_another_accounts_profile_is_access_denied(bedrock_endpoint, arn):
    assert (
        error_code(lambda: bedrock(bedrock_endpoint).get_inference_profile(inferenceProfileIdentifier=arn))
        == "AccessDeniedException"
    )


def test_the_local_account_is_motos_default():
    from moto.core import DEFAULT_ACCOUNT_ID

    assert ACCOUNT == DEFAULT_ACCOUNT_ID == "123456789012"


# --- application profiles ----------------------------------------------------------


def test_an_application_profile_copied_from_a_system_profile_routes_like_it(bedrock_endpoint):
    client = bedrock(bedrock_endpoint)
    system_arn = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{US_PROFILE}"
    created = client.create_inference_profile(
        inferenceProfileName="tenant-a", description="Tenant A", modelSource={"copyFrom": system_arn}
    )
    assert created["ResponseMetadata"]["HTTPStatusCode"] == 201 and created["status"] == "ACTIVE"
    arn = created["inferenceProfileArn"]
    assert APPLICATION_ARN.match(arn), arn
    answer = get_profile(client, arn)
    assert (answer["type"], answer["status"], answer["inferenceProfileName"], answer["description"]) == (
        "APPLICATION",
        "ACTIVE",
        "tenant-a",
        "Tenant A",
    )
    assert answer["inferenceProfileId"] == arn.rsplit("/", 1)[1]
    assert model_arns(answer) == model_arns(get_profile(client, system_arn))
    assert get_profile(client, answer["inferenceProfileId"]) == answer  # by id too


def test_an_application_profile_copied_from_a_foundation_model_serves_its_region(bedrock_endpoint):
    client = bedrock(bedrock_endpoint, "eu-west-1")
    model_arn = "arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0"
    arn = client.create_inference_profile(
        inferenceProfileName="single", modelSource={"copyFrom": model_arn}, tags=[{"key": "team", "value": "a"}]
    )["inferenceProfileArn"]
    assert arn.startswith("arn:aws:bedrock:eu-west-1:123456789012:application-inference-profile/")
    assert model_arns(get_profile(client, arn)) == [model_arn]
    assert (
        error_code(
            lambda: bedrock(bedrock_endpoint, "us-east-1").get_inference_profile(
                inferenceProfileIdentifier=arn.rsplit("/", 1)[1]
            )
        )
        == "ResourceNotFoundException"
    )  # ids are regional


def test_an_application_profile_in_china_gets_the_china_partition(bedrock_endpoint):
    arn = bedrock(bedrock_endpoint, "cn-north-1").create_inference_profile(
        inferenceProfileName="cn",
        modelSource={"copyFrom": "arn:aws-cn:bedrock:cn-north-1::foundation-model/amazon.nova-pro-v1:0"},
    )["inferenceProfileArn"]
    assert arn.startswith("arn:aws-cn:bedrock:cn-north-1:123456789012:application-inference-profile/")


def test_a_retried_create_returns_the_same_profile_and_a_taken_name_conflicts(bedrock_endpoint):
    client = bedrock(bedrock_endpoint)
    request = {
        "inferenceProfileName": "retried",
        "clientRequestToken": "token-1",
        "modelSource": {"copyFrom": "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"},
    }
    first = client.create_inference_profile(**request)["inferenceProfileArn"]
    assert client.create_inference_profile(**request)["inferenceProfileArn"] == first
    assert (
        error_code(lambda: client.create_inference_profile(**{**request, "clientRequestToken": "token-2"}))
        == "ConflictException"
    )


@pytest.mark.parametrize(
    "source, code",
    [
        (f"arn:aws:bedrock:us-east-1:999999999999:inference-profile/{US_PROFILE}", "AccessDeniedException"),
        (f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.{NOVA_2_LITE}", "ResourceNotFoundException"),
        ("arn:aws:bedrock:us-west-2::foundation-model/amazon.nova-pro-v1:0", "ValidationException"),  # other region
        ("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6", "ValidationException"),
        ("amazon.nova-pro-v1:0", "ValidationException"),
    ],
)
def test_a_create_from_what_cannot_be_copied_is_refused(bedrock_endpoint, source, code):
    assert (
        error_code(
            lambda: bedrock(bedrock_endpoint).create_inference_profile(
                inferenceProfileName="refused", modelSource={"copyFrom": source}
            )
        )
        == code
    )


def test_application_profiles_survive_a_restart_when_kept_in_a_file(tmp_path):
    state = tmp_path / "inference-profiles.json"
    before = InferenceProfiles(state)
    created = before.create(
        "us-east-1",
        {
            "inferenceProfileName": "kept",
            "modelSource": {"copyFrom": f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{US_PROFILE}"},
        },
    )
    after = InferenceProfiles(state)
    assert after.get(created["inferenceProfileArn"], "us-east-1") == before.get(
        created["inferenceProfileArn"], "us-east-1"
    )


def test_other_bedrock_operations_are_refused_not_crashed(bedrock_endpoint):
    assert error_code(lambda: bedrock(bedrock_endpoint).list_inference_profiles()) == "UnknownOperationException"


# --- bedrock-runtime: Converse, ConverseStream, InvokeModel -----------------------------


def runtime(endpoint: str, region: str = "us-east-1", **config):
    """A developer's boto3 Bedrock runtime client of the local stack (``config``: botocore's)."""
    return boto3.client(
        "bedrock-runtime",
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(**config),
    )


def bedrock_metric(name: str, model: str, region: str = "us-east-1") -> float:
    """Sum of an ``AWS/Bedrock`` metric of one ModelId in the local CloudWatch (moto)."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    answer = boto3.client("cloudwatch", region_name=region).get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": "AWS/Bedrock",
                        "MetricName": name,
                        "Dimensions": [{"Name": "ModelId", "Value": model}],
                    },
                    "Period": 60,
                    "Stat": "Sum",
                },
            }
        ],
        StartTime=now - timedelta(minutes=10),
        EndTime=now + timedelta(minutes=1),
    )
    return sum(answer["MetricDataResults"][0]["Values"])


def valid_output(client, operation: str, answer: dict) -> None:
    answer = {key: value for key, value in answer.items() if key != "ResponseMetadata"}
    shape = client.meta.service_model.operation_model(operation).output_shape
    report = ParamValidator().validate(answer, shape)
    assert not report.has_errors(), report.generate_report()


def test_converse_counts_tokens_from_the_request_and_records_bedrocks_metrics(aws, bedrock_endpoint):
    client = runtime(bedrock_endpoint)
    messages = [{"role": "user", "content": [{"text": "x" * 400}]}]  # 100 tokens at 4 characters each
    answer = client.converse(modelId=NOVA_2_LITE, messages=messages, inferenceConfig={"maxTokens": 50})
    valid_output(client, "Converse", answer)
    assert answer["usage"] == {"inputTokens": 100, "outputTokens": 50, "totalTokens": 150}
    client.converse(modelId=NOVA_2_LITE, messages=messages)  # no maxTokens: the default
    assert bedrock_metric("Invocations", NOVA_2_LITE) == 2
    assert bedrock_metric("InputTokenCount", NOVA_2_LITE) == 200
    assert bedrock_metric("OutputTokenCount", NOVA_2_LITE) == 50 + 100
    assert bedrock_metric("Invocations", US_PROFILE) == 0  # by ModelId as the caller named it


def test_converse_stream_answers_an_event_stream_with_the_usage_in_its_metadata(aws, bedrock_endpoint):
    client = runtime(bedrock_endpoint)
    answer = client.converse_stream(
        modelId=US_PROFILE, messages=[{"role": "user", "content": [{"text": "hello world!"}]}]
    )
    events = list(answer["stream"])
    assert events[0] == {"messageStart": {"role": "assistant"}}
    assert events[-1]["metadata"]["usage"] == {"inputTokens": 3, "outputTokens": 100, "totalTokens": 103}
    assert "".join(e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e)
    assert bedrock_metric("OutputTokenCount", US_PROFILE) == 100


def test_a_cache_point_writes_the_prefix_once_then_reads_it(aws, bedrock_endpoint):
    client = runtime(bedrock_endpoint)
    system = [{"text": "s" * 800}, {"cachePoint": {"type": "default"}}]
    messages = [{"role": "user", "content": [{"text": "q" * 40}]}]
    first, second = (
        client.converse(modelId=NOVA_2_LITE, system=system, messages=messages, inferenceConfig={"maxTokens": 5})[
            "usage"
        ]
        for _ in range(2)
    )
    assert (first["inputTokens"], first["cacheWriteInputTokens"], first["cacheReadInputTokens"]) == (10, 200, 0)
    assert (second["cacheWriteInputTokens"], second["cacheReadInputTokens"]) == (0, 200)
    assert bedrock_metric("CacheWriteInputTokenCount", NOVA_2_LITE) == 200
    assert bedrock_metric("CacheReadInputTokenCount", NOVA_2_LITE) == 200


def test_invoke_model_answers_with_token_count_headers(aws, bedrock_endpoint):
    import json

    client = runtime(bedrock_endpoint)
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 7,
        "messages": [{"role": "user", "content": "abcd"}],
    }
    answer = client.invoke_model(modelId="anthropic.claude-3-haiku-20240307-v1:0", body=json.dumps(body))
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    assert (headers["x-amzn-bedrock-input-token-count"], headers["x-amzn-bedrock-output-token-count"]) == ("1", "7")
    assert json.loads(answer["body"].read())["usage"] == {"input_tokens": 1, "output_tokens": 7}


def test_invoke_model_answers_novas_body_shape(aws, bedrock_endpoint):
    import json

    body = {"schemaVersion": "messages-v1", "messages": [{"role": "user", "content": [{"text": "abcdefgh"}]}]}
    answer = runtime(bedrock_endpoint).invoke_model(
        modelId=NOVA_2_LITE, body=json.dumps(body | {"inferenceConfig": {"maxTokens": 3}})
    )
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    assert (headers["x-amzn-bedrock-input-token-count"], headers["x-amzn-bedrock-output-token-count"]) == ("2", "3")
    reply = json.loads(answer["body"].read())
    assert reply["usage"] == {"inputTokens": 2, "outputTokens": 3, "totalTokens": 5}
    assert reply["output"]["message"]["content"][0]["text"]


@pytest.mark.parametrize("shape", ["anthropic", "nova"])
def test_invoke_model_with_response_stream_ends_with_the_invocation_metrics(aws, bedrock_endpoint, shape):
    import json

    model = "anthropic.claude-3-haiku-20240307-v1:0" if shape == "anthropic" else "amazon.nova-pro-v1:0"
    if shape == "anthropic":
        body = {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "abcd"}],
        }
    else:
        body = {"messages": [{"role": "user", "content": [{"text": "abcd"}]}], "inferenceConfig": {"maxTokens": 4}}
    answer = runtime(bedrock_endpoint).invoke_model_with_response_stream(modelId=model, body=json.dumps(body))
    chunks = [json.loads(event["chunk"]["bytes"]) for event in answer["body"]]
    text = "".join(
        (chunk.get("delta") or {}).get("text", "")
        or ((chunk.get("contentBlockDelta") or {}).get("delta") or {}).get("text", "")
        for chunk in chunks
    )
    assert text == "This is the local Bedrock stand-in."
    metrics = chunks[-1]["amazon-bedrock-invocationMetrics"]
    assert (metrics["inputTokenCount"], metrics["outputTokenCount"]) == (1, 4)
    assert bedrock_metric("OutputTokenCount", model) >= 4


def test_a_converse_without_messages_is_a_validation_error(aws, bedrock_endpoint):
    request = {"modelId": NOVA_2_LITE, "messages": [], "inferenceConfig": {"maxTokens": 5}}
    assert error_code(lambda: runtime(bedrock_endpoint).converse(**request)) == "ValidationException"
