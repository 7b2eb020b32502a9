"""What an outside review of ``make run`` found in the Bedrock stand-in (``local/bedrock.py``)
and the reconciler, held: real boto3 ``bedrock``/``bedrock-runtime`` clients (or signed raw
posts, for bodies boto3 will not send) against the local server, the stand-in's ``Runtime``
where memory is what is measured, and the reconciler over moto's CloudWatch."""

from __future__ import annotations

import json
import logging
import tracemalloc
from datetime import UTC, date, datetime, timedelta

import boto3
import botocore.session
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from botocore.parsers import create_parser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local import bedrock as standin
from local.bedrock import MAX_OUTPUT_TOKENS, REGIONS, BedrockError, Runtime
from price_keeper.aws import bedrock
from price_keeper.aws import events as alert_events
from price_keeper.config import get_config
from price_keeper.domain import alerts, reconciliation
from price_keeper.store import alert_records
from tests.factories import seed_app, seed_org
from tests.test_local_bedrock import runtime as local_runtime
from tests.usage_support import iso, submit_and_fold

NOVA_PRO = "amazon.nova-pro-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "hello"}]}]
RUNTIME_MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")


def runtime(endpoint: str, region: str = "us-east-1", **config):
    """The local stack's runtime client, no retries (a refusal is answered once)."""
    return local_runtime(endpoint, region, retries={"max_attempts": 1}, **config)


def refusal(call) -> tuple[str, int]:
    """(error code, HTTP status) of the ClientError ``call`` raises."""
    with pytest.raises(ClientError) as raised:
        call()
    return raised.value.response["Error"]["Code"], raised.value.response["ResponseMetadata"]["HTTPStatusCode"]


def cached_read(stand_in: Runtime, prefix: str) -> bool:
    """Whether a Converse whose system prompt is ``prefix`` before a cache point reads it."""
    request = {"system": [{"text": prefix}, {"cachePoint": {"type": "default"}}], "messages": MESSAGES}
    return stand_in.usage(NOVA_PRO, request)["cacheReadInputTokens"] > 0


# --- M2: the prompt cache is bounded -------------------------------------------------


def test_many_distinct_large_prefixes_keep_the_prompt_cache_within_its_bound():
    """A digest of each prefix is kept, not its text: 300 distinct 100 KB prefixes (30 MB of
    text) leave under 300 KB behind."""
    tracemalloc.start()
    try:
        cache = Runtime()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(300):
            assert not cached_read(cache, f"{number:03}" + "p" * 100_000)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 300_000, f"the prompt cache kept {retained} bytes for 300 prefixes"
    assert cached_read(cache, "299" + "p" * 100_000)  # the most recent one is still cached


def test_past_its_bound_the_prompt_cache_forgets_the_least_recently_used_prefix():
    cache = Runtime(prompt_cache_entries=3)
    assert not any(cached_read(cache, prefix) for prefix in ("a" * 400, "b" * 400, "c" * 400))
    assert cached_read(cache, "a" * 400)  # a is now the most recently used
    assert not cached_read(cache, "d" * 400)  # a fourth prefix: b, the least recently used, goes
    assert cached_read(cache, "a" * 400)
    assert not cached_read(cache, "b" * 400)  # written again (and c goes)
    assert cached_read(cache, "d" * 400)


# --- M3: only Regions botocore's partition data lists ---------------------------------


@pytest.mark.parametrize("region", ["mars-north-1", "us-fake-1"])  # us-fake-1 fits the aws partition's pattern
def test_a_call_signed_for_a_made_up_region_is_refused_as_aws_refuses_it(aws, bedrock_endpoint, region, caplog):
    clients_before = standin._cloudwatch.cache_info().currsize
    with caplog.at_level(logging.ERROR):
        converse = refusal(lambda: runtime(bedrock_endpoint, region).converse(modelId=NOVA_PRO, messages=MESSAGES))
        control = boto3.client(
            "bedrock",
            region_name=region,
            endpoint_url=bedrock_endpoint,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        profile = refusal(lambda: control.get_inference_profile(inferenceProfileIdentifier=f"us.{NOVA_PRO}"))
    assert converse == profile == ("InvalidSignatureException", 403)
    assert standin._cloudwatch.cache_info().currsize == clients_before  # no client made for it
    assert not caplog.records  # a refusal, not a crash with its traceback


def test_every_listed_region_is_served_and_the_clients_are_at_most_one_a_region(aws):
    assert set(REGIONS) == {region for _, region in bedrock.known_regions()}  # the layer's known Regions
    body = json.dumps({"messages": MESSAGES}).encode()
    for region in REGIONS:
        assert Runtime().respond("POST", f"/model/{NOVA_PRO}/converse", region, body)["statusCode"] == 200
    assert standin._cloudwatch.cache_info().maxsize == len(REGIONS)


# --- L1: maxTokens is bounded, and the reconciler survives an absurd count -------------


@pytest.mark.parametrize("max_tokens", [0, MAX_OUTPUT_TOKENS + 1, 10**39])
def test_converse_refuses_a_max_tokens_bedrock_refuses(aws, bedrock_endpoint, max_tokens):
    client = runtime(bedrock_endpoint, parameter_validation=False)  # botocore itself refuses 0
    for call in (client.converse, client.converse_stream):
        assert refusal(
            lambda call=call: call(modelId=NOVA_PRO, messages=MESSAGES, inferenceConfig={"maxTokens": max_tokens})
        ) == ("ValidationException", 400)
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": max_tokens, "messages": MESSAGES})
    assert refusal(lambda: client.invoke_model(modelId=NOVA_PRO, body=body)) == ("ValidationException", 400)
    assert not boto3.client("cloudwatch").list_metrics(Namespace="AWS/Bedrock")["Metrics"]  # nothing recorded


def test_converse_accepts_max_tokens_up_to_the_models_output_limit(aws, bedrock_endpoint):
    answer = runtime(bedrock_endpoint).converse(
        modelId=NOVA_PRO, messages=MESSAGES, inferenceConfig={"maxTokens": MAX_OUTPUT_TOKENS}
    )
    assert answer["usage"]["outputTokens"] == MAX_OUTPUT_TOKENS


DAY = date(2026, 11, 20)
NOON = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
TOLERANCE = timedelta(seconds=get_config().reconciliation.tolerance_seconds)


def bedrock_call(model: str, at: datetime, input_tokens: int, output_tokens) -> None:
    """The datapoints the stand-in records for one call (``Runtime.record_metrics``), at ``at``."""
    values = {
        "Invocations": 1,
        "InputTokenCount": input_tokens,
        "OutputTokenCount": output_tokens,
        "CacheReadInputTokenCount": 0,
        "CacheWriteInputTokenCount": 0,
    }
    boto3.client("cloudwatch").put_metric_data(
        Namespace="AWS/Bedrock",
        MetricData=[
            {"MetricName": name, "Dimensions": [{"Name": "ModelId", "Value": model}], "Value": v, "Timestamp": at}
            for name, v in values.items()
        ],
    )


@pytest.mark.parametrize("absurd", [10**39, float("inf"), -1000, 2.5])
def test_an_absurd_bedrock_datapoint_is_left_out_and_the_rest_of_the_day_reconciled(aws, caplog, absurd):
    org_id = seed_org(timezone="UTC", model_ordering=("premium", "standard", "economy"))
    seed_app(org_id, "app-1")
    boto3.client("events").create_event_bus(Name=alert_events.DEFAULT_EVENT_BUS)
    for minute in (1, 2, 3):
        bedrock_call(NOVA_PRO, NOON + timedelta(minutes=minute), 1000, 200)
    bedrock_call(NOVA_PRO, NOON + timedelta(minutes=4), 1, absurd)  # maxTokens=absurd, as the stand-in took it
    fields = {"model_label": "premium", "bedrock_model_id": NOVA_PRO, "input_tokens": 1000, "output_tokens": 200}
    submit_and_fold(
        org_id, "app-1", NOON + timedelta(minutes=1, seconds=5), timestamp=iso(NOON + timedelta(minutes=1)), **fields
    )

    with caplog.at_level(logging.WARNING):
        result = reconciliation.reconcile(DAY, NOON + timedelta(minutes=5) + TOLERANCE)

    (row,) = [found for found in result["models"] if found["model_id"] == NOVA_PRO]
    assert row["bedrock"] == {"invocations": 4, "input_tokens": 3001, "output_tokens": 600}
    assert (row["unmetered"]["input_tokens"], row["unmetered"]["output_tokens"]) == (2001, 400)
    assert reconciliation.stored("2026-11-20")["models"] == result["models"]  # the day's result is kept
    (alert,) = alert_records.of_day(alerts.OPERATOR_SCOPE, "20261120").values()
    assert (alert["type"], alert["model_id"]) == ("UNREPORTED_USAGE", NOVA_PRO)
    (logged,) = [
        record for record in caplog.records if record.getMessage().startswith("AWS/Bedrock datapoint left out")
    ]
    assert (logged.model_id, logged.metric, logged.at) == (NOVA_PRO, "OutputTokenCount", "2026-11-20T12:04:00Z")


# --- L2: a body of the wrong shape is Bedrock's ValidationException ----------------------


def signed_post(endpoint: str, path: str, body: bytes, region: str = "us-east-1") -> requests.Response:
    """A POST signed as boto3 signs it, with a body boto3 would not serialize."""
    request = AWSRequest(method="POST", url=endpoint + path, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials("local", "local"), "bedrock", region).add_auth(request)
    return requests.post(request.url, data=body, headers=dict(request.headers.items()), timeout=10)


def botocore_error_code(response: requests.Response, operation: str) -> str:
    """The error code botocore reads from the answer (what boto3 raises as), by its own parser."""
    parsed = create_parser("rest-json").parse(
        {"status_code": response.status_code, "headers": response.headers, "body": response.content},
        RUNTIME_MODEL.operation_model(operation).output_shape,
    )
    return parsed["Error"]["Code"]


WELL_FORMED = {"messages": MESSAGES}
MALFORMED = {
    "messages=5": {"messages": 5},
    "messages=text": {"messages": "hello"},
    "messages=object": {"messages": {"role": "user"}},
    "message=5": {"messages": [5]},
    "message-without-content": {"messages": [{"role": "user"}]},
    "content=5": {"messages": [{"role": "user", "content": 5}]},
    "block=5": {"messages": [{"role": "user", "content": [5]}]},
    "text=5": {"messages": [{"role": "user", "content": [{"text": 5}]}]},
    "system=5": {**WELL_FORMED, "system": 5},
    "system-block=5": {**WELL_FORMED, "system": [5]},
    "system=object": {**WELL_FORMED, "system": {"text": "an object, not a list"}},
    "inferenceConfig=list": {**WELL_FORMED, "inferenceConfig": [1]},
    "inferenceConfig=text": {**WELL_FORMED, "inferenceConfig": "fast"},
    "maxTokens=text": {**WELL_FORMED, "inferenceConfig": {"maxTokens": "5"}},
    "maxTokens=2.5": {**WELL_FORMED, "inferenceConfig": {"maxTokens": 2.5}},
    "maxTokens=true": {**WELL_FORMED, "inferenceConfig": {"maxTokens": True}},
}
OPERATIONS = {"converse": "Converse", "converse-stream": "ConverseStream", "invoke": "InvokeModel"}


@pytest.mark.parametrize("path_operation", OPERATIONS)
@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED)
def test_a_body_of_the_wrong_shape_is_bedrocks_validation_exception(aws, bedrock_endpoint, path_operation, body):
    response = signed_post(bedrock_endpoint, f"/model/{NOVA_PRO}/{path_operation}", json.dumps(body).encode())
    assert response.status_code == 400, response.text
    assert response.headers["x-amzn-ErrorType"] == "ValidationException"
    assert response.json()["message"]
    assert botocore_error_code(response, OPERATIONS[path_operation]) == "ValidationException"


@pytest.mark.parametrize("body", [b"[1]", b"not json", b"[" * 100_000 + b"]" * 100_000], ids=["array", "text", "deep"])
def test_a_body_that_is_no_json_object_is_bedrocks_validation_exception(aws, bedrock_endpoint, body):
    response = signed_post(bedrock_endpoint, f"/model/{NOVA_PRO}/converse", body)
    assert (response.status_code, response.headers["x-amzn-ErrorType"]) == (400, "ValidationException")
    assert botocore_error_code(response, "Converse") == "ValidationException"


def test_boto3_raises_bedrocks_validation_exception_for_a_wrong_type_it_lets_through(aws, bedrock_endpoint):
    client = runtime(bedrock_endpoint, parameter_validation=False)
    with pytest.raises(client.exceptions.ValidationException):
        client.converse(modelId=NOVA_PRO, messages=[{"role": "user", "content": [{"text": 5}]}])


MEMBERS = st.sampled_from(
    ["messages", "system", "inferenceConfig", "maxTokens", "max_tokens", "content", "text", "cachePoint", "role"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(MEMBERS | st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(request=st.dictionaries(MEMBERS, JSON, max_size=4))
def test_any_json_object_is_answered_or_refused_with_a_validation_exception(request):
    try:
        usage = Runtime().usage(NOVA_PRO, request)
    except BedrockError as error:
        assert (error.code, error.status) == ("ValidationException", 400)
    else:
        assert 1 <= usage["outputTokens"] <= MAX_OUTPUT_TOKENS
