"""``instrument()`` end to end: the local server (``python -m local``) with its Bedrock stand-in
and its reconciler every second (1 s tolerance); plain boto3 and the agent frameworks
(LangChain ``ChatBedrockConverse``, Strands ``BedrockModel``, LlamaIndex ``BedrockConverse``)
call Bedrock through an instrumented client, streamed calls included, and the
reconciliation of the models they called shows 0 unmetered tokens. ``enforce`` refuses a
spent label before Bedrock is called; ``route`` calls the fallback model.

One server and one tenant for the module. Each framework calls an application inference
profile of its own, so its reconciliation row holds its calls only."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import boto3
import pytest
import requests

from price_keeper_client import PriceKeeper, QuotaExceeded, instrument, uninstrument
from tests.client.conftest import wait_for
from tests.local_server import reconciling_server
from tests.tenants import Tenant, new_tenant

KEY = "instrument-provisioning-key"
ADMIN = {"X-API-Key": KEY}
MICRO, PRO, LITE = "amazon.nova-micro-v1:0", "amazon.nova-pro-v1:0", "amazon.nova-2-lite-v1:0"
HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
PROMPT = "How much did this cost? " * 10  # 240 characters: 60 tokens
MESSAGES = [{"role": "user", "content": [{"text": PROMPT}]}]
SETTLE_SECONDS = 60
NOTHING_UNMETERED = {"input_tokens": 0, "output_tokens": 0, "estimated_cost_usd_micros": 0}

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with reconciling_server(tmp_path_factory.mktemp("instrument"), KEY, tolerance_seconds=1) as url:
        yield url


@pytest.fixture(scope="module")
def tenant(base_url) -> Tenant:
    """One app; premium's quota is 1 µ$ (spent by its first call), standard its fallback."""
    return new_tenant(
        base_url,
        KEY,
        {"web": {"app_name": "W"}},
        model_ordering=["premium", "standard", "economy"],
        quotas={"premium": 1, "standard": 50_000_000, "economy": 50_000_000},
    )


def aws(service: str, base_url: str, session: boto3.Session | None = None):
    return (session or boto3).client(
        service,
        region_name="us-east-1",
        endpoint_url=base_url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def keeper(tenant: Tenant) -> PriceKeeper:
    credentials = tenant.credentials["web"]
    return PriceKeeper(
        tenant.base_url, credentials["client_id"], credentials["client_secret"], report_in_background=True
    )


def app_profile(tenant: Tenant, model: str, label: str) -> str:
    """A new application inference profile copying ``model``, registered by the app as ``label``."""
    profile = aws("bedrock", tenant.base_url).create_inference_profile(
        inferenceProfileName=f"{label}-{uuid.uuid4().hex[:8]}",
        modelSource={"copyFrom": f"arn:aws:bedrock:us-east-1::foundation-model/{model}"},
    )["inferenceProfileArn"]
    registered = requests.post(
        f"{tenant.app_path('web')}/inference-profiles",
        headers=tenant.bearer("web"),
        timeout=10,
        json={"profile_label": label, "inference_profile_arn": profile},
    )
    assert registered.status_code == 201, registered.text
    return profile


def reconciled(base_url: str, model_id: str, invocations: int) -> dict | None:
    """Today's row of ``model_id`` once Bedrock's side counts ``invocations`` calls and the
    metered side as many."""
    today = datetime.now(UTC).date().isoformat()
    reply = requests.get(f"{base_url}/api/v1/reconciliation", params={"date": today}, headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text
    row = next((row for row in reply.json()["models"] if row["model_id"] == model_id.rsplit("/", 1)[-1]), None)
    if row and row["bedrock"]["invocations"] >= invocations and row["metered"]["invocations"] >= invocations:
        return row
    return None


def assert_all_metered(base_url: str, model_id: str, invocations: int) -> dict:
    row = wait_for(lambda: reconciled(base_url, model_id, invocations), timeout=SETTLE_SECONDS)
    assert row["bedrock"]["invocations"] == row["metered"]["invocations"] == invocations, row
    assert row["bedrock"] == row["metered"], row
    assert row["unmetered"] == NOTHING_UNMETERED, row
    return row


def test_plain_boto3_every_operation_and_model_id_form_is_metered(tenant):
    guard = keeper(tenant)
    haiku = app_profile(tenant, HAIKU, "haiku")
    runtime = aws("bedrock-runtime", tenant.base_url)
    instrumentation = instrument(runtime, guard, labels={haiku: "haiku"})
    assert instrument(runtime, guard, mode="enforce") is instrumentation  # twice: a no-op
    config = {"inferenceConfig": {"maxTokens": 40}}
    assert runtime.converse(modelId=MICRO, messages=MESSAGES, **config)["usage"]["outputTokens"] == 40
    arn = f"arn:aws:bedrock:us-east-1::foundation-model/{MICRO}"
    events = list(runtime.converse_stream(modelId=arn, messages=MESSAGES, **config)["stream"])
    assert events[-1]["metadata"]["usage"]["inputTokens"] == 60
    stopped = runtime.converse_stream(modelId=MICRO, messages=MESSAGES, **config)
    for _event in stopped["stream"]:
        break  # the reader stops early: the rest is drained in the background and reported
    del stopped, _event
    nova = json.dumps({"messages": MESSAGES, **config})
    answer = runtime.invoke_model(modelId=MICRO, body=nova)
    assert json.loads(answer["body"].read())["usage"]["outputTokens"] == 40  # the body is left to the app
    chunks = [
        json.loads(e["chunk"]["bytes"])
        for e in runtime.invoke_model_with_response_stream(modelId=MICRO, body=nova)["body"]
    ]
    assert "amazon-bedrock-invocationMetrics" in chunks[-1]
    anthropic = json.dumps(
        {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 30, "messages": [{"role": "user", "content": PROMPT}]}
    )
    runtime.invoke_model(modelId=haiku, body=anthropic)["body"].read()
    stream = runtime.invoke_model_with_response_stream(modelId=haiku, body=anthropic)["body"]
    next(iter(stream))
    stream.close()  # closed after one chunk: drained and reported
    assert instrumentation.unmapped_calls == 0
    assert uninstrument(runtime) and not uninstrument(runtime)
    assert wait_for(lambda: instrumentation.reported == 7, timeout=SETTLE_SECONDS)  # the drains included
    assert guard.close()
    assert_all_metered(tenant.base_url, MICRO, 5)
    assert_all_metered(tenant.base_url, haiku, 2)


def test_enforce_refuses_a_spent_label_before_bedrock_and_route_calls_the_fallback(tenant):
    guard = keeper(tenant)
    enforced = aws("bedrock-runtime", tenant.base_url)
    instrument(enforced, guard, mode="enforce")
    config = {"inferenceConfig": {"maxTokens": 40}}
    enforced.converse(modelId=PRO, messages=MESSAGES, **config)  # premium's 1 µ$ quota: spent by this call
    assert guard.flush(SETTLE_SECONDS)
    # the service counts it within seconds; the selection then moves on from premium
    wait_for(lambda: guard.select_model(force=True).label == "standard", timeout=SETTLE_SECONDS)
    with pytest.raises(QuotaExceeded):
        enforced.converse(modelId=PRO, messages=MESSAGES, **config)
    with pytest.raises(QuotaExceeded):
        enforced.converse_stream(modelId=f"us.{PRO}", messages=MESSAGES, **config)
    routed = aws("bedrock-runtime", tenant.base_url)
    instrument(routed, guard, mode="route")
    answer = routed.converse(modelId=PRO, messages=MESSAGES, **config)
    assert answer["usage"]["outputTokens"] == 40
    assert guard.close()
    assert_all_metered(tenant.base_url, LITE, 1)  # the routed call, made after the refused ones
    row = assert_all_metered(tenant.base_url, PRO, 1)  # only the first: the refused calls never reached Bedrock
    assert row["bedrock"]["invocations"] == 1


def instrumented_runtime(tenant, label: str):
    """(keeper, an application profile of Nova Lite registered as ``label``, a bedrock-runtime
    client instrumented to report its calls under that label)."""
    guard = keeper(tenant)
    profile = app_profile(tenant, LITE, label)
    runtime = aws("bedrock-runtime", tenant.base_url)
    instrument(runtime, guard, labels={profile: label})
    return guard, profile, runtime


def test_langchain_chat_bedrock_converse(tenant):
    from langchain_aws import ChatBedrockConverse

    guard, profile, runtime = instrumented_runtime(tenant, "langchain")
    chat = ChatBedrockConverse(
        model=profile,
        provider="amazon",
        client=runtime,
        bedrock_client=aws("bedrock", tenant.base_url),
        max_tokens=40,
    )
    assert chat.invoke(PROMPT).content
    assert "".join(chunk.text for chunk in chat.stream(PROMPT))
    assert chat.invoke(PROMPT).usage_metadata["output_tokens"] == 40
    assert guard.close()
    assert_all_metered(tenant.base_url, profile, 3)


def test_strands_bedrock_model(tenant):
    from strands import Agent
    from strands.models import BedrockModel

    guard = keeper(tenant)
    profile = app_profile(tenant, LITE, "strands")
    session = boto3.Session(aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1")
    instrument(session, guard, labels={profile: "strands"})  # every client the session makes from now on
    streamed = BedrockModel(model_id=profile, boto_session=session, endpoint_url=tenant.base_url, max_tokens=40)
    assert str(Agent(model=streamed, callback_handler=None)(PROMPT))
    whole = BedrockModel(
        model_id=profile, boto_session=session, endpoint_url=tenant.base_url, max_tokens=40, streaming=False
    )
    assert str(Agent(model=whole, callback_handler=None)(PROMPT))
    assert guard.close()
    assert_all_metered(tenant.base_url, profile, 2)


def test_llamaindex_bedrock_converse(tenant):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.bedrock_converse import BedrockConverse

    guard, profile, runtime = instrumented_runtime(tenant, "llamaindex")
    llm = BedrockConverse(
        model=LITE, application_inference_profile_arn=profile, client=runtime, max_tokens=40, region_name="us-east-1"
    )
    assert llm.complete(PROMPT).text
    assert "".join(piece.delta for piece in llm.stream_chat([ChatMessage(role="user", content=PROMPT)]))
    assert guard.close()
    assert_all_metered(tenant.base_url, profile, 2)
