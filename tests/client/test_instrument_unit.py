"""The instrumentation's pieces without a server: model ids in every form, the label map,
usage from InvokeModel bodies, the spool file, and (un)registration on clients and sessions."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import boto3
import pytest

from price_keeper_client import instrument, uninstrument
from price_keeper_client.instrument import LabelMap, body_usage, model_key
from price_keeper_client.models import UsageRecord
from price_keeper_client.spool import Spool, read_unfinished
from tests.client.conftest import FakeClock
from tests.client.test_reporting_unit import record as reporting_record

APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"


@pytest.mark.parametrize(
    "model_id",
    [
        "amazon.nova-micro-v1:0",
        "us.amazon.nova-micro-v1:0",
        "global.amazon.nova-micro-v1:0",
        "apac.amazon.nova-micro-v1:0",
        "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-micro-v1:0",
        "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.amazon.nova-micro-v1:0",
    ],
)
def test_every_form_of_a_model_id_names_the_model(model_id):
    assert model_key(model_id) == "amazon.nova-micro-v1:0"


def test_an_application_profile_is_its_arn():
    assert model_key(APP_PROFILE) == APP_PROFILE


class Keeper:
    """What ``LabelMap`` asks of a keeper: the labels and their models, counted."""

    def __init__(self, labels):
        self.labels, self.reads = labels, 0

    def label_models(self):
        self.reads += 1
        return self.labels


def test_the_label_map_prefers_the_exact_id_then_the_first_label_of_the_ordering():
    keeper = Keeper(
        [
            ("premium", "amazon.nova-pro-v1:0"),
            ("ultra", "amazon.nova-pro-v1:0"),
            ("us_pro", "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"),
            ("mine", APP_PROFILE),
        ]
    )
    clock = FakeClock()
    labels = LabelMap(keeper, {"arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/x": "x"}, clock)
    assert labels.label("amazon.nova-pro-v1:0") == "premium"
    assert labels.label("eu.amazon.nova-pro-v1:0") == "premium"
    assert labels.label("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0") == "us_pro"
    assert labels.label(APP_PROFILE) == "mine"
    assert labels.label("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/x") == "x"
    assert keeper.reads == 1
    assert labels.label("anthropic.claude-3-haiku-20240307-v1:0") is None  # a miss reads again at most once a minute
    clock.advance(61)
    assert labels.label("anthropic.claude-3-haiku-20240307-v1:0") is None
    assert keeper.reads == 2


def test_usage_from_each_providers_invoke_body():
    assert body_usage({"usage": {"input_tokens": 3, "output_tokens": 4}})["outputTokens"] == 4  # Anthropic
    assert body_usage({"usage": {"inputTokens": 3, "outputTokens": 5}}) == {"inputTokens": 3, "outputTokens": 5}
    metrics = {"amazon-bedrock-invocationMetrics": {"inputTokenCount": 7, "outputTokenCount": 8}}
    assert (body_usage(metrics)["inputTokens"], body_usage(metrics)["outputTokens"]) == (7, 8)
    assert body_usage(["not", "a", "body"]) == {}


def record(**fields) -> UsageRecord:
    """A usage record stamped to the second (as a spool line keeps it)."""
    return reporting_record(**{"timestamp": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), **fields})


def test_the_spool_keeps_what_is_not_done_and_a_torn_last_line_is_skipped(tmp_path):
    spool = Spool(tmp_path)
    first, second = record(cache_read_input_tokens=9, calling_region="eu-west-1"), record(status="ERROR")
    spool.add([first, second])
    spool.done([first.request_id])
    with open(spool.path, "ab") as file:
        file.write(b'{"record": {"request_id": "torn')  # a write cut short
    assert read_unfinished(spool.path) == [second]
    spool.done([second.request_id])
    assert spool.path.stat().st_size == 0  # nothing left: truncated
    spool.close()
    assert not spool.path.exists()


def test_a_live_keepers_file_is_not_adopted_a_dead_ones_is(tmp_path):
    alive, other = Spool(tmp_path), Spool(tmp_path)
    records = [record(), record()]
    alive.add(records)
    assert other.adopt() == []  # locked by its keeper
    dead = tmp_path / "12345-dead.spool"
    dead.write_text("".join(json.dumps({"record": r.to_json()}) + "\n" for r in records))
    assert sorted(r.request_id for r in other.adopt()) == sorted(r.request_id for r in records)
    assert not dead.exists() and read_unfinished(other.path) == records
    alive.close()
    other.close()
    assert sorted(os.listdir(tmp_path)) == sorted([alive.path.name, other.path.name])  # both still owe records


def bedrock(session=None):
    return (session or boto3).client(
        "bedrock-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def handlers(client, event: str) -> list:
    """The handlers the client's emitter calls for ``event``."""
    return list(client.meta.events._emitter._handlers.prefix_search(event))


def test_instrumenting_twice_is_a_no_op_and_uninstrument_removes_the_handlers():
    client, keeper = bedrock(), Keeper([])
    event = "before-parameter-build.bedrock-runtime.Converse"
    before = len(handlers(client, event))
    first = instrument(client, keeper)
    assert instrument(client, keeper, mode="enforce") is first and first.mode == "observe"
    assert len(handlers(client, event)) == before + 1
    assert uninstrument(client) and not uninstrument(client)
    assert len(handlers(client, event)) == before


def test_a_session_instruments_the_clients_it_makes_from_then_on():
    session = boto3.Session()
    made_before = bedrock(session)
    event = "after-call.bedrock-runtime.InvokeModel"
    instrument(session, Keeper([]))
    assert len(handlers(bedrock(session), event)) == len(handlers(made_before, event)) + 1
    assert uninstrument(session)


def test_only_a_bedrock_runtime_client_is_instrumented():
    with pytest.raises(TypeError):
        instrument(boto3.client("s3", region_name="us-east-1"), Keeper([]))


def stream_of(chunks: list[dict]) -> list[dict]:
    return [{"chunk": {"bytes": json.dumps(chunk).encode()}} for chunk in chunks]


def meter_of(events: list[dict]) -> dict:
    from price_keeper_client.instrument import _StreamMeter

    meter = _StreamMeter(None, None)
    for event in events:
        meter.see(event)
    return meter.usage


def test_a_streams_usage_is_the_invocation_metrics_else_the_providers_counts():
    anthropic = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"text": "hi"}},
        {"type": "message_delta", "usage": {"output_tokens": 30}},
    ]
    assert meter_of(stream_of(anthropic)) == {"inputTokens": 12, "outputTokens": 30}
    metrics = {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {"inputTokenCount": 13, "outputTokenCount": 31},
    }
    usage = meter_of(stream_of([*anthropic, metrics]))
    assert (usage["inputTokens"], usage["outputTokens"]) == (13, 31)
    nova = [{"metadata": {"usage": {"inputTokens": 5, "outputTokens": 6}}}]
    assert meter_of(stream_of(nova)) == {"inputTokens": 5, "outputTokens": 6}
    assert meter_of([{"metadata": {"usage": {"inputTokens": 7, "outputTokens": 8}}}]) == {
        "inputTokens": 7,
        "outputTokens": 8,
    }
