"""Guarded Bedrock calls against the real local server: ConverseStream relays Bedrock's
events unchanged and reports the stream's usage (``metadata``), a broken or abandoned
stream is reported with what it has as ``ERROR``, and a call that fails after reaching
Bedrock (throttled, refused, timed out) is reported as ``ERROR`` before its error is raised.
Bedrock is a real bedrock-runtime client: Stubber answers Converse, and ConverseStream
answers are real event-stream bytes botocore parses (conftest ``answer_converse_stream``)."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError, EventStreamError, ReadTimeoutError
from botocore.stub import Stubber
from urllib3.exceptions import ProtocolError

from price_keeper_client import ConverseStream

from .conftest import WireStream, answer_converse_stream, provision, stream_events, stream_exception, wait_for
from .test_runtime_server import MESSAGES, PREMIUM, make_keeper

pytestmark = pytest.mark.e2e

# What botocore yields for stream_events("Hello there", 1500, 800): the events the caller must see.
EXPECTED_EVENTS = [
    {"messageStart": {"role": "assistant"}},
    {"contentBlockDelta": {"delta": {"text": "Hello"}, "contentBlockIndex": 0}},
    {"contentBlockDelta": {"delta": {"text": " there"}, "contentBlockIndex": 0}},
    {"contentBlockStop": {"contentBlockIndex": 0}},
    {"messageStop": {"stopReason": "end_turn"}},
    {
        "metadata": {
            "usage": {"inputTokens": 1500, "outputTokens": 800, "totalTokens": 2300},
            "metrics": {"latencyMs": 412},
        }
    },
]
PREMIUM_COST = 3760  # 1500 x 0.80 + 800 x 3.20 USD per 1M tokens (config.yaml premium)


def bedrock_runtime():
    """A real bedrock-runtime client (one attempt per call: no retry delays in tests)."""
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.fixture
def keeper_and_bedrock(server):
    _, creds = provision(server)
    bedrock = bedrock_runtime()
    keeper, calls = make_keeper(server, creds, bedrock_client=bedrock)
    yield keeper, bedrock, calls
    assert keeper.close()


def test_converse_stream_relays_the_events_and_reports_the_metadata_usage(keeper_and_bedrock):
    keeper, bedrock, calls = keeper_and_bedrock
    sent = answer_converse_stream(bedrock, WireStream(stream_events()))
    stream = keeper.converse_stream(messages=MESSAGES, inferenceConfig={"maxTokens": 256})
    assert isinstance(stream, ConverseStream) and stream.usage is None  # nothing reported before the end
    assert list(stream) == EXPECTED_EVENTS
    assert sent == [{"modelId": PREMIUM, "messages": MESSAGES, "inferenceConfig": {"maxTokens": 256}}]
    (reported,) = calls.bodies("POST", "/usage")
    assert (reported["status"], reported["input_tokens"], reported["output_tokens"]) == ("OK", 1500, 800)
    assert (reported["model_label"], reported["bedrock_model_id"], reported["calling_region"]) == (
        "premium",
        PREMIUM,
        "us-east-1",
    )
    assert stream.usage.request_id == reported["request_id"]
    assert stream.receipt.cost_usd_micros == PREMIUM_COST


@pytest.mark.parametrize(
    "messages, breaks_with, raised, tokens",
    [
        # Bedrock's error event inside the stream (botocore: EventStreamError)
        (
            stream_events()[:3] + [stream_exception("throttlingException", "Too many tokens")],
            None,
            EventStreamError,
            (0, 0),
        ),
        # the connection drops before the metadata: nothing known
        (stream_events()[:2], ProtocolError("Connection broken: IncompleteRead"), ProtocolError, (0, 0)),
        # the connection drops after the metadata: its counts are what it has
        (stream_events(), ProtocolError("Connection broken"), ProtocolError, (1500, 800)),
    ],
)
def test_a_broken_stream_is_reported_with_what_it_has_as_error(
    keeper_and_bedrock, messages, breaks_with, raised, tokens
):
    keeper, bedrock, calls = keeper_and_bedrock
    answer_converse_stream(bedrock, WireStream(messages, breaks_with))
    stream = keeper.converse_stream(messages=MESSAGES)
    relayed = []
    with pytest.raises(raised):
        for event in stream:
            relayed.append(event)
    assert relayed == EXPECTED_EVENTS[: len(relayed)] and relayed
    (reported,) = calls.bodies("POST", "/usage")
    assert (reported["status"], reported["input_tokens"], reported["output_tokens"]) == ("ERROR", *tokens)
    assert stream.receipt.status == "accepted" and stream.usage.status == "ERROR"


def test_a_stream_left_before_its_end_is_reported_once_as_error(keeper_and_bedrock):
    keeper, bedrock, calls = keeper_and_bedrock
    body = WireStream(stream_events())
    answer_converse_stream(bedrock, body)
    with keeper.converse_stream(messages=MESSAGES) as stream:
        for event in stream:
            if "contentBlockDelta" in event:
                break
    (reported,) = calls.bodies("POST", "/usage")
    assert (reported["status"], reported["input_tokens"], reported["output_tokens"]) == ("ERROR", 0, 0)
    assert body.closed  # the connection is given back
    stream.close()  # closing again reports nothing more
    assert calls.count("POST", "/usage") == 1


@pytest.mark.parametrize(
    "code, status", [("ThrottlingException", 429), ("ValidationException", 400), ("ModelTimeoutException", 408)]
)
def test_a_converse_call_bedrock_refuses_is_reported_as_error_then_raised(keeper_and_bedrock, code, status):
    keeper, bedrock, calls = keeper_and_bedrock
    with Stubber(bedrock) as stubber, pytest.raises(ClientError) as raised:
        stubber.add_client_error("converse", code, "refused", status)
        keeper.converse(messages=MESSAGES)
    assert raised.value.response["Error"]["Code"] == code
    (reported,) = calls.bodies("POST", "/usage")
    assert (reported["status"], reported["input_tokens"], reported["output_tokens"]) == ("ERROR", 0, 0)
    assert reported["model_label"] == "premium"


def test_a_timed_out_call_is_reported_and_one_that_never_left_is_not(keeper_and_bedrock):
    keeper, bedrock, calls = keeper_and_bedrock
    url = "https://bedrock-runtime.us-east-1.amazonaws.com"
    failure = {"error": ReadTimeoutError(endpoint_url=url)}  # sent, no answer in time

    def fail(**_):
        raise failure["error"]

    bedrock.meta.events.register("before-send.bedrock-runtime.Converse", fail)
    with pytest.raises(ReadTimeoutError):
        keeper.converse(messages=MESSAGES)
    assert [body["status"] for body in calls.bodies("POST", "/usage")] == ["ERROR"]
    failure["error"] = EndpointConnectionError(endpoint_url=url)  # never reached Bedrock
    with pytest.raises(EndpointConnectionError):
        keeper.converse(messages=MESSAGES)
    assert calls.count("POST", "/usage") == 1  # nothing to bill, nothing reported


def test_failed_calls_are_in_the_days_records(keeper_and_bedrock):
    keeper, bedrock, _ = keeper_and_bedrock
    with Stubber(bedrock) as stubber, pytest.raises(ClientError):
        stubber.add_client_error("converse", "ThrottlingException", "slow down", 429)
        keeper.converse(messages=MESSAGES)
    answer_converse_stream(bedrock, WireStream(stream_events()))
    list(keeper.converse_stream(messages=MESSAGES))
    spend = wait_for(lambda: (lambda s: s if s.total_requests >= 2 else None)(keeper.daily_spend()))
    premium = {label.label: label for label in spend.labels}["premium"]
    assert (premium.requests, premium.input_tokens, premium.cost_usd_micros) == (2, 1500, PREMIUM_COST)
