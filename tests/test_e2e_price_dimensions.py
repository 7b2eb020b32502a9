"""Over real HTTP against ``python -m local``: ``PriceKeeper.converse`` and ``converse_stream``
on the priority tier with a 1-hour cache point report records the service prices at the
priority and 1-hour rates (the local Bedrock stand-in answers with ``cacheDetails`` and
echoes ``serviceTier``, as Bedrock does), and the hard cap reserves at the call's tier."""

from __future__ import annotations

import boto3
import pytest
import requests
import yaml

from price_keeper_client import PriceKeeper
from tests.client.conftest import CallLog
from tests.local_server import ROOT, local_server
from tests.tenants import new_tenant

KEY = "e2e-dimensions-provisioning-key"
SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
# Claude Sonnet 4.5's on-demand prices per 1M tokens: a 5-minute cache write at 1.25x the input
# price, a 1-hour one at 2x; the priority tier at 175 % of each.
CLAUDE = {
    "type": "model",
    "id": SONNET,
    "input_price_usd_micros_per_1m": 3_000_000,
    "output_price_usd_micros_per_1m": 15_000_000,
    "cache_read_price_usd_micros_per_1m": 300_000,
    "cache_write_price_usd_micros_per_1m": 3_750_000,
    "cache_write_1h_price_usd_micros_per_1m": 6_000_000,
    "offers": {"priority": {"pct": 175}},
}
PREFIX = "You are a careful assistant. " * 40  # 1,160 characters before the cache point: 290 tokens
MESSAGES = [
    {
        "role": "user",
        "content": [{"text": PREFIX}, {"cachePoint": {"type": "default", "ttl": "1h"}}, {"text": "Hello? " * 8}],
    }
]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dimensions")
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["model_labels"]["claude"] = CLAUDE
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    with local_server(folder, KEY, PRICE_KEEPER_CONFIG=str(config)) as url:
        yield url


def keeper(base_url: str, **options) -> tuple[PriceKeeper, CallLog]:
    """A keeper of a new org whose only label is ``claude``, and the log of its calls."""
    tenant = new_tenant(base_url, KEY, {"web": {"app_name": "W"}}, model_ordering=["claude"], quotas={"claude": 10**8})
    credentials = tenant.credentials["web"]
    runtime = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=base_url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    session = requests.Session()
    calls = CallLog(session)
    keeper = PriceKeeper(
        base_url,
        credentials["client_id"],
        credentials["client_secret"],
        bedrock_client=runtime,
        session=session,
        **options,
    )
    return keeper, calls


def priority_cost(input_tokens: int, output_tokens: int, one_hour_writes: int) -> int:
    """micro-USD at the priority rates (175 % of the standard ones), rounded up once."""
    scaled = 175 * (input_tokens * 3_000_000 + output_tokens * 15_000_000 + one_hour_writes * 6_000_000)
    return -(-scaled // (100 * 1_000_000))


def test_converse_on_the_priority_tier_with_a_1_hour_cache_point_is_priced_at_both_rates(base_url):
    client, _ = keeper(base_url)
    answer = client.converse(messages=MESSAGES, inferenceConfig={"maxTokens": 50}, serviceTier={"type": "priority"})
    usage = answer.response["usage"]
    assert answer.response["serviceTier"] == {"type": "priority"}  # Bedrock's echo
    assert usage["cacheDetails"] == [{"ttl": "1h", "inputTokens": usage["cacheWriteInputTokens"]}]
    written = usage["cacheWriteInputTokens"]
    assert written > 0
    record = answer.usage
    assert (record.service_tier, record.cache_write_input_tokens, record.cache_write_1h_input_tokens) == (
        "priority",
        written,
        written,
    )
    pricing = answer.receipt.raw["pricing"]
    assert (pricing["service_tier"], pricing["source"]) == ("priority", "CONFIG_FALLBACK")
    assert pricing["rates"]["cache_write_1h_price_usd_micros_per_1m"] == 10_500_000  # 6.00 x 175 %
    assert answer.receipt.cost_usd_micros == priority_cost(usage["inputTokens"], usage["outputTokens"], written)
    # the same call on the default tier, its prefix written again for 5 minutes: cheaper on both counts
    default = client.converse(
        messages=[{**MESSAGES[0], "content": [{"text": "Other " + PREFIX}, {"cachePoint": {"type": "default"}}]}],
        inferenceConfig={"maxTokens": 50},
    )
    assert default.usage.service_tier == "default" and default.usage.cache_write_1h_input_tokens == 0
    assert default.receipt.cost_usd_micros < answer.receipt.cost_usd_micros
    assert client.close()


def test_converse_stream_and_the_hard_cap_carry_the_tier_too(base_url):
    client, calls = keeper(base_url, hard_cap=True)
    stream = client.converse_stream(
        messages=[{**MESSAGES[0], "content": [{"text": "Streamed " + PREFIX}, *MESSAGES[0]["content"][1:]]}],
        inferenceConfig={"maxTokens": 50},
        serviceTier={"type": "priority"},
    )
    events = list(stream)
    assert events[-1]["metadata"]["serviceTier"] == {"type": "priority"}
    usage = events[-1]["metadata"]["usage"]
    assert stream.usage.service_tier == "priority"
    assert stream.usage.cache_write_1h_input_tokens == usage["cacheWriteInputTokens"] > 0
    assert stream.receipt.cost_usd_micros == priority_cost(
        usage["inputTokens"], usage["outputTokens"], usage["cacheWriteInputTokens"]
    )
    (held,) = calls.bodies("POST", "/reservations")
    assert held["service_tier"] == "priority"
    settled = stream.receipt.raw["reservation"]
    assert settled["settled"] is True
    # the hold was priced at the priority tier: at least the call's actual cost
    assert settled["amount_usd_micros"] >= stream.receipt.cost_usd_micros
    assert settled["over_reservation_usd_micros"] == 0
    assert client.close()
