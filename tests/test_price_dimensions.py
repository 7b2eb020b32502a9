"""The ways Bedrock bills the same tokens at different prices: service tiers, batch inference,
latency-optimized inference, long context and 1-hour cache writes. Each read by the pricing
fetcher from recorded GetProducts answers (botocore Stubber, the real usage type names), or
from config.yaml, then a usage record of each kind priced by the real handler on moto."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends

from price_keeper import state
from price_keeper.aws import price_list
from price_keeper.config import config_path, get_config, read_raw
from price_keeper.domain import pricing
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table
from price_keeper.timeutil import utc_now
from tests.conftest import assert_error
from tests.test_pricing import product, stub_price_list
from tests.usage_support import dedup_items, new_tenant, usage_body

QWEN, SONNET_4, SONNET_45, LLAMA = "Qwen3 32B", "Claude Sonnet 4", "Claude Sonnet 4.5", "Llama 3.1 70B"
SONNET_4_ID = "anthropic.claude-sonnet-4-20250514-v1:0"
ON_DEMAND_ORG = "5e1f0c2a-7d3b-4c1e-9a2f-0b6d8e4c3a21"  # counts its reserved-tier calls at on-demand rates
SONNET_45_GLOBAL = (
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.anthropic.claude-sonnet-4-5-20250929-v1:0"
)
SONNET_4_GLOBAL = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.{SONNET_4_ID}"


def recorded(usage_type: str, model: str, inference_type: str, usd: str, feature: str = "On-demand Inference") -> str:
    """A GetProducts entry under its real usage type (the shape of ``test_pricing.product``)."""
    entry = json.loads(product(model, "us-east-1", inference_type, usd, feature=feature))
    entry["product"]["attributes"]["usagetype"] = usage_type
    return json.dumps(entry)


# USD per 1K tokens, as the Price List has them; usage types as AWS names them.
PRICE_LIST = {
    QWEN: [
        recorded("USE1-Qwen3-32B-input-tokens", QWEN, "Input tokens", "0.00015"),
        recorded("USE1-Qwen3-32B-output-tokens", QWEN, "Output tokens", "0.0006"),
        recorded("USE1-Qwen3-32B-input-tokens-priority", QWEN, "Input tokens priority", "0.0002625"),
        recorded("USE1-Qwen3-32B-output-tokens-priority", QWEN, "Output tokens priority", "0.00105"),
        recorded("USE1-Qwen3-32B-input-tokens-flex", QWEN, "Input tokens flex", "0.000075"),
        recorded("USE1-Qwen3-32B-output-tokens-flex", QWEN, "Output tokens flex", "0.0003"),
        # batch: told apart by the feature alone (the inference type is the standard one's)
        recorded("USE1-Qwen3-32B-input-tokens-batch", QWEN, "Input tokens", "0.000075", "Batch Inference"),
        recorded("USE1-Qwen3-32B-output-tokens-batch", QWEN, "Output tokens", "0.0003", "Batch Inference"),
        # the same rates under the "mantle" names: not read twice
        recorded("USE1-qwen.qwen3-32b-mantle-input-tokens-priority", QWEN, "Input tokens priority", "0.0003", ""),
    ],
    SONNET_45: [
        recorded("USE1-Claude4.5Sonnet-input-tokens", SONNET_45, "Input tokens", "0.003"),
        recorded("USE1-Claude4.5Sonnet-output-tokens", SONNET_45, "Output tokens", "0.015"),
        recorded("USE1-Claude4.5Sonnet-cache-read-input-token-count", SONNET_45, "Cache read input tokens", "0.0003"),
        recorded(
            "USE1-Claude4.5Sonnet-cache-write-input-token-count", SONNET_45, "Cache write input tokens", "0.00375"
        ),
        recorded(
            "USE1-Claude4.5Sonnet-cache-write-1h-input-token-count", SONNET_45, "Cache write input tokens", "0.006"
        ),
        recorded("USE1-Claude4.5Sonnet-input-tokens-cross-region-global", SONNET_45, "Input tokens", "0.0027"),
        recorded("USE1-Claude4.5Sonnet-output-tokens-cross-region-global", SONNET_45, "Output tokens", "0.0135"),
    ],
    SONNET_4: [
        recorded("USE1-Claude4Sonnet-input-tokens-cross-region-global", SONNET_4, "Input tokens", "0.003"),
        recorded("USE1-Claude4Sonnet-output-tokens-cross-region-global", SONNET_4, "Output tokens", "0.015"),
        recorded(
            "USE1-Claude4Sonnet-input-tokens-long-context-cross-region-global",
            SONNET_4,
            "Input tokens long context",
            "0.006",
        ),
        recorded(
            "USE1-Claude4Sonnet-output-tokens-long-context-cross-region-global",
            SONNET_4,
            "Output tokens long context",
            "0.0225",
        ),
    ],
    LLAMA: [
        recorded("USE1-Llama3-1-70B-input-tokens", LLAMA, "Input tokens", "0.00072"),
        recorded("USE1-Llama3-1-70B-output-tokens", LLAMA, "Output tokens", "0.00072"),
    ],
    # latency-optimized inference: a model of its own in the Price List
    f"{LLAMA} Latency Optimized": [
        recorded(
            "USE1-Llama3-1-70B-LatencyOptimized-input-tokens", f"{LLAMA} Latency Optimized", "Input tokens", "0.0009"
        ),
        recorded(
            "USE1-Llama3-1-70B-LatencyOptimized-output-tokens", f"{LLAMA} Latency Optimized", "Output tokens", "0.0009"
        ),
    ],
}

# What config.yaml would hold of these models: prices far from the Price List's, so a test
# tells which one priced a record.
FAR = {"input_price_usd_micros_per_1m": 1, "output_price_usd_micros_per_1m": 1}
LABELS = {
    "qwen": {"type": "model", "id": "qwen.qwen3-32b-v1:0", "price_list_model": QWEN, **FAR},
    "sonnet45": {
        "type": "model",
        "id": "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "price_list_model": SONNET_45,
        **FAR,
    },
    "sonnet4": {
        "type": "model",
        "id": SONNET_4_ID,
        "price_list_model": SONNET_4,
        "long_context_threshold_tokens": 200_000,
        **FAR,
    },
    "sonnet4-global": {"type": "profile", "id": SONNET_4_GLOBAL, **FAR},
    "sonnet45-global": {"type": "profile", "id": SONNET_45_GLOBAL, **FAR},
    "llama": {"type": "model", "id": "meta.llama3-1-70b-instruct-v1:0", "price_list_model": LLAMA, **FAR},
}


@pytest.fixture
def dimensions_config(aws, bedrock_endpoint, monkeypatch, tmp_path):
    """config.yaml with the labels above (and an org that counts reserved calls at on-demand)."""
    raw = read_raw(config_path())
    raw["model_labels"].update(LABELS)
    raw["reserved_tier"] = {"orgs_at_on_demand": [ON_DEMAND_ORG]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setenv("PRICE_KEEPER_CONFIG", str(path))
    state.reset()
    yield
    monkeypatch.delenv("PRICE_KEEPER_CONFIG", raising=False)
    state.reset()


_fetched_on: dict = {}  # UTC day -> (the fetcher's report, a copy of the PricingCache table it filled)


@pytest.fixture
def fetched(dimensions_config):
    """PricingCache filled by the fetcher from the recorded answers. The first test of a
    process and UTC day fetches; the others get a copy of the table it filled (moto takes
    about a second to parse the fetcher's 30 conditional writes)."""
    moto_tables = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].tables
    name, today = tables.PRICING_CACHE.physical_name, utc_now().date()
    if today not in _fetched_on:
        configured = {label.price_list_model for label in get_config().labels.values() if label.price_list_model}
        client, stubber = stub_price_list(
            {**{name: [[]] for name in configured}, **{k: [v] for k, v in PRICE_LIST.items()}}
        )
        report = pricing.refresh_pricing_cache(utc_now(), client)
        stubber.assert_no_pending_responses()
        assert report["status"] == "ok"
        _fetched_on[today] = report, copy.deepcopy(moto_tables[name])
    report, filled = _fetched_on[today]
    moto_tables[name] = copy.deepcopy(filled)
    return report


def cost(api, tenant, **fields) -> dict:
    reply = api.post(tenant.app_path + "/usage", usage_body(**fields), token=tenant.token)
    assert reply.status == 202, reply.json()
    return reply.json()


def micros(usd_per_1k: str, tokens: int) -> int:
    """What ``tokens`` cost at a Price List price, micro-USD (exact; the records are round)."""
    exact = price_list.micros_per_1m(usd_per_1k, "1K tokens") * tokens
    assert exact % 1_000_000 == 0
    return exact // 1_000_000


# --- each dimension as the Price List prices it -----------------------------------------


@pytest.mark.parametrize(
    "fields, source_rates",
    [
        ({"service_tier": "priority"}, ("0.0002625", "0.00105")),
        ({"service_tier": "flex"}, ("0.000075", "0.0003")),
        ({"inference_type": "BATCH"}, ("0.000075", "0.0003")),
        ({"service_tier": "default"}, ("0.00015", "0.0006")),
    ],
)
def test_a_tier_and_batch_are_priced_at_their_price_list_rates(fetched, api, fields, source_rates):
    tenant = new_tenant()
    body = cost(api, tenant, model_label="qwen", input_tokens=10_000, output_tokens=2_000, **fields)
    assert body["processing"]["cost_usd_micros"] == micros(source_rates[0], 10_000) + micros(source_rates[1], 2_000)
    assert body["pricing"]["source"] == "PRICING_API"
    assert {name: body["pricing"][name] for name in fields} == fields


def test_a_1_hour_cache_write_is_priced_at_its_own_rate(fetched, api):
    tenant = new_tenant()
    body = cost(
        api,
        tenant,
        model_label="sonnet45",
        input_tokens=1_000,
        output_tokens=1_000,
        cache_write_input_tokens=3_000,
        cache_write_1h_input_tokens=2_000,
    )
    expected = (
        micros("0.003", 1_000) + micros("0.015", 1_000) + micros("0.00375", 1_000) + micros("0.006", 2_000)
    )  # 1,000 written for 5 minutes, 2,000 for an hour
    assert body["processing"]["cost_usd_micros"] == expected
    assert body["pricing"]["rates"]["cache_write_1h_price_usd_micros_per_1m"] == 6_000_000


def test_a_global_call_without_a_1_hour_price_of_its_own_takes_the_in_region_one(fetched, api):
    tenant = new_tenant()
    body = cost(
        api,
        tenant,
        model_label="sonnet45-global",
        calling_region="us-east-1",
        bedrock_model_id="anthropic.claude-sonnet-4-5-20250929-v1:0",
        input_tokens=1_000,
        output_tokens=1_000,
        cache_write_input_tokens=1_000,
        cache_write_1h_input_tokens=1_000,
    )
    assert (body["pricing"]["profile_kind"], body["pricing"]["source"]) == ("GLOBAL", "PRICING_API")
    assert body["processing"]["cost_usd_micros"] == micros("0.0027", 1_000) + micros("0.0135", 1_000) + micros(
        "0.006", 1_000
    )


def test_a_request_over_the_threshold_is_priced_whole_at_the_long_context_rate(fetched, api):
    tenant = new_tenant()
    at = {"model_label": "sonnet4-global", "calling_region": "us-east-1", "bedrock_model_id": SONNET_4_ID}
    short = cost(api, tenant, input_tokens=200_000, output_tokens=1_000, **at)
    assert short["pricing"]["long_context"] is False and short["pricing"]["profile_kind"] == "GLOBAL"
    assert short["processing"]["cost_usd_micros"] == micros("0.003", 200_000) + micros("0.015", 1_000)
    long = cost(api, tenant, input_tokens=190_000, cache_read_input_tokens=20_000, output_tokens=1_000, **at)
    assert long["pricing"]["long_context"] is True  # input and cache reads over 200k
    assert long["processing"]["cost_usd_micros"] == (
        micros("0.006", 190_000)
        + micros("0.0225", 1_000)
        + 20_000 * long["pricing"]["rates"]["cache_read_price_usd_micros_per_1m"] // 1_000_000
    )


def test_latency_optimized_inference_is_priced_as_its_own_price_list_model(fetched, api):
    tenant = new_tenant()
    body = cost(api, tenant, model_label="llama", input_tokens=10_000, output_tokens=10_000, latency_optimized=True)
    assert body["processing"]["cost_usd_micros"] == 2 * micros("0.0009", 10_000)
    assert body["pricing"]["latency_optimized"] is True and body["pricing"]["source"] == "PRICING_API"


def test_with_the_same_tokens_priority_costs_more_flex_less_and_a_1h_write_more_than_5m(fetched, api):
    tenant = new_tenant()
    tokens = {"model_label": "qwen", "input_tokens": 5_000, "output_tokens": 5_000}
    default, priority, flex = (
        cost(api, tenant, service_tier=tier, **tokens)["processing"]["cost_usd_micros"]
        for tier in ("default", "priority", "flex")
    )
    assert flex < default < priority
    writes = {"model_label": "sonnet45", "input_tokens": 0, "output_tokens": 0, "cache_write_input_tokens": 4_000}
    five_minutes = cost(api, tenant, **writes)["processing"]["cost_usd_micros"]
    one_hour = cost(api, tenant, cache_write_1h_input_tokens=4_000, **writes)["processing"]["cost_usd_micros"]
    assert five_minutes < one_hour


# --- config.yaml's prices, the estimate, reserved capacity --------------------------------


def test_config_prices_each_dimension_the_price_list_lacks(dimensions_config, api):
    tenant = new_tenant()
    base = {"model_label": "premium", "input_tokens": 10_000, "output_tokens": 10_000}
    standard = cost(api, tenant, **base)["processing"]["cost_usd_micros"]
    assert standard == 40_000  # Nova Pro: 0.80 + 3.20 per 1M
    for fields, pct in (
        ({"service_tier": "priority"}, 175),
        ({"service_tier": "flex"}, 50),
        ({"inference_type": "BATCH"}, 50),
        ({"latency_optimized": True}, 125),
    ):
        body = cost(api, tenant, **base, **fields)
        assert body["pricing"]["source"] == "CONFIG_FALLBACK"
        assert body["processing"]["cost_usd_micros"] == standard * pct // 100, fields


def test_reserved_calls_count_their_tokens_at_no_cost_unless_the_org_chooses_on_demand(dimensions_config, api):
    reserved = {"input_tokens": 10_000, "output_tokens": 10_000, "service_tier": "reserved"}
    tenant = new_tenant()
    body = cost(api, tenant, **reserved)
    assert body["processing"]["cost_usd_micros"] == 0 and body["pricing"]["source"] == "RESERVED"
    (marker,) = dedup_items()
    assert (marker["input_tokens"], marker["output_tokens"], marker["service_tier"]) == (10_000, 10_000, "reserved")
    on_demand = new_tenant(org_id=ON_DEMAND_ORG)
    body = cost(api, on_demand, **reserved)
    assert body["processing"]["cost_usd_micros"] == 40_000 and body["pricing"]["source"] == "CONFIG_FALLBACK"


def test_a_rate_without_a_price_counts_at_the_estimate_until_the_price_list_has_it(fetched, api):
    tenant = new_tenant()
    body = cost(api, tenant, model_label="qwen", input_tokens=1_000, output_tokens=1_000, latency_optimized=True)
    assert body["pricing"]["source"] == "ESTIMATE"  # Qwen has no latency-optimized price anywhere
    estimate = pricing.estimate(pricing.LATENCY_OPTIMIZED)
    assert body["processing"]["cost_usd_micros"] == pricing.cost_usd_micros(pricing.Tokens(1_000, 1_000), estimate)
    assert estimate.input >= pricing.estimate().input * 125 // 100  # the floor's latency-optimized share
    (marker,) = dedup_items()
    assert marker["latency_optimized"] is True

    # the Price List lists it later: the record is re-priced to it, exactly once
    pages = {name: [[]] for name in {label.price_list_model for label in get_config().labels.values()} if name}
    pages |= {k: [v] for k, v in PRICE_LIST.items()}
    pages[f"{QWEN} Latency Optimized"] = [
        [
            recorded(
                "USE1-Qwen3-32B-LatencyOptimized-input-tokens", f"{QWEN} Latency Optimized", "Input tokens", "0.0002"
            ),
            recorded(
                "USE1-Qwen3-32B-LatencyOptimized-output-tokens", f"{QWEN} Latency Optimized", "Output tokens", "0.0008"
            ),
        ]
    ]
    client, _ = stub_price_list(pages)
    assert pricing.refresh_pricing_cache(utc_now(), client)["repriced"] == 1
    (marker,) = dedup_items()
    assert int(marker["cost_usd_micros"]) == micros("0.0002", 1_000) + micros("0.0008", 1_000)
    assert marker["price_source"] == "PRICING_API"


# --- the wire ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"service_tier": "premium"},
        {"inference_type": "PROVISIONED"},
        {"latency_optimized": "yes"},
        {"cache_write_input_tokens": 100, "cache_write_1h_input_tokens": 101},
        {"inference_type": "BATCH", "service_tier": "priority"},
    ],
)
def test_an_unknown_or_impossible_dimension_is_refused_with_nothing_written(api, fields):
    tenant = new_tenant()
    reply = api.post(tenant.app_path + "/usage", usage_body(**fields), token=tenant.token)
    assert_error(reply, 400, "INVALID_REQUEST")
    batch = api.post(
        tenant.app_path + "/usage/batch", {"requests": [usage_body(), usage_body(**fields)]}, token=tenant.token
    )
    assert batch.status == 200 or batch.status == 207, batch.json()
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["accepted", "failed"] and results[1]["error"] == "INVALID_REQUEST"
    assert len(dedup_items()) == 1  # the good record only


def test_a_duplicate_is_answered_with_the_dimensions_it_was_counted_with(dimensions_config, api):
    tenant = new_tenant()
    body = usage_body(service_tier="priority", input_tokens=1_000, output_tokens=1_000)
    first = api.post(tenant.app_path + "/usage", body, token=tenant.token).json()
    again = api.post(tenant.app_path + "/usage", body, token=tenant.token).json()
    assert again["duplicate"] is True
    assert again["processing"]["cost_usd_micros"] == first["processing"]["cost_usd_micros"]
    assert again["pricing"]["service_tier"] == "priority" and "rates" not in again["pricing"]


def test_a_reservation_holds_the_worst_case_of_its_tier_and_long_context(fetched, api):
    ordering = ("qwen", "sonnet4-global", "sonnet45")
    tenant = new_tenant(model_ordering=ordering, quotas=dict.fromkeys(ordering, 10**9))

    def held(**fields) -> int:
        reply = api.post(tenant.app_path + "/reservations", fields, token=tenant.token)
        assert reply.status == 201, reply.json()
        return reply.json()["amount_usd_micros"]

    base = {"model_label": "qwen", "max_input_tokens": 10_000, "max_output_tokens": 1_000}
    assert held(**base, service_tier="flex") < held(**base) < held(**base, service_tier="priority")
    assert held(**base, service_tier="priority") == micros("0.0002625", 10_000) + micros("0.00105", 1_000)
    sonnet = {"model_label": "sonnet4-global", "calling_region": "us-east-1", "max_output_tokens": 1_000}
    assert held(**sonnet, max_input_tokens=300_000) == micros("0.006", 300_000) + micros("0.0225", 1_000)
    # every cache write at the dearer 1-hour rate
    writes = held(
        model_label="sonnet45", max_input_tokens=1_000, max_output_tokens=0, max_cache_write_input_tokens=1_000
    )
    assert writes == micros("0.003", 1_000) + micros("0.006", 1_000)
    assert_error(
        api.post(tenant.app_path + "/reservations", {**base, "service_tier": "gold"}, token=tenant.token),
        400,
        "INVALID_REQUEST",
    )


def test_the_marker_keeps_the_dimensions_and_the_1h_writes(fetched, api):
    tenant = new_tenant()
    request_id = str(uuid.uuid4())
    cost(
        api,
        tenant,
        request_id=request_id,
        model_label="sonnet45",
        cache_write_input_tokens=10,
        cache_write_1h_input_tokens=10,
        service_tier="priority",
    )
    marker = (
        table(tables.USAGE_AGG_SHARDED)
        .get_item(Key=keys.marker_key(tenant.org_id, tenant.app_id, request_id, 8))
        .get("Item")
    )
    assert (marker["cache_write_1h_input_tokens"], marker["service_tier"]) == (10, "priority")
    assert "inference_type" not in marker  # the defaults are left out: a marker stays small
