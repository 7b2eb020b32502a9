"""Cost maths, Price List parsing, the pricing fetcher (botocore Stubber with responses
shaped like the real GetProducts ones) and the price-of-the-day lookup (moto)."""

from __future__ import annotations

import json
import random
import zlib
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction

import boto3
import pytest
from botocore.stub import Stubber
from hypothesis import given
from hypothesis import strategies as st

from local.gateway import LambdaContext, load_handler
from price_keeper.aws import price_list
from price_keeper.config import GEOGRAPHIC, GLOBAL, IN_REGION, Prices, get_config, parse_config
from price_keeper.domain import pricing
from price_keeper.store import tables
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_date, org_days_in_play
from tests.iam_check import only_granted
from tests.usage_support import new_tenant, usage_body

# --- cost maths --------------------------------------------------------------------


def parse_price_list(entries, model_names: set[str], day: date) -> dict:
    """The token prices of ``model_names`` in ``entries`` in effect on ``day``, by kind and offer."""
    return pricing.prices_on(price_list.price_points(entries, model_names), day)


def test_cost_matches_the_spec_example():
    # api_spec: 1500 input + 800 output at $3 / $15 per 1M tokens = 16,500 micro-USD
    assert pricing.cost_usd_micros(pricing.Tokens(1500, 800), Prices(3_000_000, 15_000_000)) == 16_500


def test_cost_is_rounded_once_and_up():
    # three components of 0.333333 micro-USD each: rounded once (1), not per component (3)
    prices = Prices(333_333, 333_333, 333_333, 0)
    assert pricing.cost_usd_micros(pricing.Tokens(1, 1, 1, 0), prices) == 1
    assert pricing.cost_usd_micros(pricing.Tokens(1, 0), Prices(800_000, 0)) == 1  # 0.8 -> 1
    assert pricing.cost_usd_micros(pricing.Tokens(0, 0), Prices(800_000, 3_200_000)) == 0


def test_cache_tokens_are_priced_at_their_own_rates():
    prices = get_config().labels["premium"].prices
    tokens = pricing.Tokens(input=1_000_000, output=0, cache_read=1_000_000, cache_write=1_000_000)
    assert pricing.cost_usd_micros(tokens, prices) == prices.input + prices.cache_read + prices.cache_write


counts = st.integers(min_value=0, max_value=10**10)
rates = st.integers(min_value=0, max_value=100_000_000)


@given(counts, counts, counts, counts, rates, rates, rates, rates)
def test_cost_is_the_exact_value_rounded_up(i, o, cr, cw, pi, po, pcr, pcw):
    exact = Fraction(i * pi + o * po + cr * pcr + cw * pcw, 1_000_000)
    cost = pricing.cost_usd_micros(pricing.Tokens(i, o, cr, cw), Prices(pi, po, pcr, pcw))
    assert isinstance(cost, int)
    assert exact <= cost < exact + 1


@pytest.mark.parametrize(
    ("usd", "unit", "micros"),
    [
        ("0.0008000000", "1K tokens", 800_000),
        ("0.00033", "1K tokens", 330_000),
        ("0.000035", "1K tokens", 35_000),
        ("0.80", "1M tokens", 800_000),
        ("0.0000008", "tokens", 800_000),
        ("0.0000000005", "1K tokens", 1),  # 0.5 micro-USD per 1M: half up
    ],
)
def test_price_list_units_become_micro_usd_per_million_tokens(usd, unit, micros):
    assert price_list.micros_per_1m(usd, unit) == micros


# --- the Price List ----------------------------------------------------------------

DAY = date(2026, 1, 23)
REGION_NAMES = {"us-east-1": ("USE1", "US East (N. Virginia)"), "eu-west-1": ("EU", "EU (Ireland)")}


def product(
    model: str,
    region: str,
    inference_type: str,
    usd: str,
    *,
    unit: str = "1K tokens",
    usage_suffix: str | None = None,
    feature: str = "On-demand Inference",
    effective: str = "2026-01-01T00:00:00Z",
    tiers: list[tuple[str, str]] | None = None,
) -> str:
    """One ``PriceList`` entry as GetProducts returns it (a JSON string). ``tiers``:
    (beginRange, USD) price ranges of one term instead of the single ``usd``."""
    prefix, location = REGION_NAMES[region]
    suffix = usage_suffix or inference_type.lower().replace(" ", "-")
    sku = f"SKU{zlib.crc32(repr((model, region, inference_type, suffix, usd, effective)).encode()):010d}"
    ranges = tiers or [("0", usd)]
    dimensions = {
        f"{sku}.JRTCKXETXF.{i}YS6EN2CT7": {
            "unit": unit,
            "beginRange": begin,
            "endRange": ranges[i + 1][0] if i + 1 < len(ranges) else "Inf",
            "appliesTo": [],
            "description": f"{model} {inference_type}",
            "rateCode": f"{sku}.JRTCKXETXF.{i}YS6EN2CT7",
            "pricePerUnit": {"USD": price},
        }
        for i, (begin, price) in enumerate(ranges)
    }
    return json.dumps(
        {
            "product": {
                "productFamily": "Amazon Bedrock",
                "attributes": {
                    "servicecode": "AmazonBedrock",
                    "servicename": "Amazon Bedrock",
                    "operation": "Usage",
                    "usagetype": f"{prefix}-{model.replace(' ', '')}-{suffix}",
                    "location": location,
                    "locationType": "AWS Region",
                    "regionCode": region,
                    "model": model,
                    "inferenceType": inference_type,
                    "feature": feature,
                },
                "sku": sku,
            },
            "serviceCode": "AmazonBedrock",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": dimensions,
                        "sku": sku,
                        "effectiveDate": effective,
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                }
            },
            "version": "20260101000000",
            "publicationDate": "2026-01-01T00:00:00Z",
        }
    )


NOVA_PRO = [
    product("Nova Pro", "us-east-1", "Input tokens", "0.0008000000"),
    product("Nova Pro", "us-east-1", "Output tokens", "0.0032000000"),
    product("Nova Pro", "us-east-1", "Cache read input tokens", "0.0002000000"),
    product("Nova Pro", "us-east-1", "Cache write input tokens", "0.0008000000"),
    product("Nova Pro", "us-east-1", "Input tokens", "0.0004000000", usage_suffix="input-tokens-batch"),
    product("Nova Pro", "us-east-1", "Input tokens", "0.0010000000", usage_suffix="input-tokens-latency-optimized"),
    product("Nova Pro", "us-east-1", "Input tokens", "21.18", unit="Hour", feature="Provisioned Throughput"),
    product("Nova Pro", "eu-west-1", "Input tokens", "0.0010500000"),
    product("Nova Pro", "eu-west-1", "Output tokens", "0.0042000000"),
]


def test_price_list_parsing_keeps_on_demand_token_prices_only():
    parsed = parse_price_list(
        NOVA_PRO
        + [
            product("Titan Text", "us-east-1", "Input tokens", "0.0003"),
            product("Nova Micro", "eu-west-1", "Input tokens", "0.000046"),
        ],  # no output price
        {"Nova Pro", "Nova Micro"},
        DAY,
    )
    assert parsed == {
        ("Nova Pro", "us-east-1"): {IN_REGION: Prices(800_000, 3_200_000, 200_000, 800_000)},
        ("Nova Pro", "eu-west-1"): {IN_REGION: Prices(1_050_000, 4_200_000, 0, 0)},
    }


# One model as the Price List shows it: every offer of its tokens, told apart by usage type
# (values illustrative; the shapes are GetProducts').
LITE = "Nova 2.0 Lite"
NOVA_2_LITE = [
    # standard on-demand, in-region
    product(LITE, "us-east-1", "Input tokens", "0.00033", usage_suffix="input-tokens"),
    product(LITE, "us-east-1", "Output tokens", "0.00275", usage_suffix="output-tokens"),
    product(LITE, "us-east-1", "Cache read input tokens", "0.0000825", usage_suffix="cache-read-input-token-count"),
    product(LITE, "us-east-1", "Cache write input tokens", "0.00033", usage_suffix="cache-write-input-token-count"),
    # the same input listed twice at different rates: the higher one, whatever the order
    product(LITE, "us-east-1", "Input tokens", "0.00030", usage_suffix="input-tokens"),
    # a price change announced for the 24th
    product(
        LITE, "us-east-1", "Output tokens", "0.0025", usage_suffix="output-tokens", effective="2026-01-24T00:00:00Z"
    ),
    # other offers of the same tokens
    product(LITE, "us-east-1", "Input tokens", "0.00066", usage_suffix="input-tokens-long-context"),
    product(LITE, "us-east-1", "Output tokens", "0.0055", usage_suffix="output-tokens-long-context"),
    product(LITE, "us-east-1", "Input tokens", "0.000165", usage_suffix="input-tokens-batch"),
    product(
        LITE, "us-east-1", "Output tokens", "0.001375", usage_suffix="output-tokens-batch", feature="Batch Inference"
    ),
    product(LITE, "us-east-1", "Input tokens", "0.000165", usage_suffix="input-tokens-flex"),
    product(LITE, "us-east-1", "Input tokens", "0.000578", usage_suffix="input-tokens-priority"),
    product(LITE, "us-east-1", "Output tokens", "0.0048", usage_suffix="output-tokens-priority"),
    product(LITE, "us-east-1", "Input tokens", "0.0004", usage_suffix="input-tokens-latency-optimized"),
    product(LITE, "us-east-1", "Cache write input tokens", "0.00066", usage_suffix="cache-write-1h-input-token-count"),
    product(
        LITE,
        "us-east-1",
        "Input tokens",
        "24.00",
        unit="Hour",
        feature="Provisioned Throughput",
        usage_suffix="ProvisionedThroughput-NoCommit",
    ),
    product(LITE, "us-east-1", "Input tokens", "0.0003", usage_suffix="input-tokens-batch-cross-region-global"),
    # cross-region: global (its own, lower, rate) and geographic
    product(LITE, "us-east-1", "Input tokens", "0.0003", usage_suffix="input-tokens-cross-region-global"),
    product(LITE, "us-east-1", "Output tokens", "0.0025", usage_suffix="output-tokens-cross-region-global"),
    product(
        LITE,
        "us-east-1",
        "Cache read input tokens",
        "0.000075",
        usage_suffix="cache-read-input-token-count-cross-region-global",
    ),
    product(LITE, "us-east-1", "Input tokens", "0.000363", usage_suffix="input-tokens-cross-region-geo"),
    product(LITE, "us-east-1", "Output tokens", "0.003025", usage_suffix="output-tokens-cross-region-geo"),
    # another region, whose input is priced in tiers (the first tier is the standard price)
    product(LITE, "eu-west-1", "Input tokens", "", tiers=[("0", "0.00034"), ("200000", "0.00068")]),
    product(LITE, "eu-west-1", "Output tokens", "0.00286"),
]
LITE_ON_THE_23RD = {
    (LITE, "us-east-1"): {
        # the 1-hour cache write from its own usage type
        IN_REGION: Prices(330_000, 2_750_000, 82_500, 330_000, 660_000),
        # offers with an input and an output price; what they leave out at their input ratio
        "IN_REGION/batch": Prices(165_000, 1_375_000, 41_250, 165_000, 330_000),
        "IN_REGION/priority": Prices(578_000, 4_800_000, 144_500, 578_000, 1_156_000),
        "IN_REGION/long_context": Prices(660_000, 5_500_000, 165_000, 660_000, 1_320_000),
        GLOBAL: Prices(300_000, 2_500_000, 75_000, 0),
        GEOGRAPHIC: Prices(363_000, 3_025_000, 0, 0),
    },
    (LITE, "eu-west-1"): {IN_REGION: Prices(340_000, 2_860_000, 0, 0)},
}


def test_each_kind_and_offer_gets_its_price_and_offers_without_input_and_output_none():
    assert parse_price_list(NOVA_2_LITE, {LITE}, DAY) == LITE_ON_THE_23RD


def test_a_price_takes_effect_on_its_day():
    parsed = parse_price_list(NOVA_2_LITE, {LITE}, DAY + timedelta(days=1))
    assert parsed[(LITE, "us-east-1")][IN_REGION] == Prices(330_000, 2_500_000, 82_500, 330_000, 660_000)
    assert parse_price_list(NOVA_2_LITE, {LITE}, date(2025, 12, 31)) == {}  # nothing in effect yet


def test_the_standard_price_does_not_depend_on_the_order_the_price_list_answers_in():
    for seed in range(20):
        entries = list(NOVA_2_LITE)
        random.Random(seed).shuffle(entries)
        assert parse_price_list(entries, {LITE}, DAY) == LITE_ON_THE_23RD, seed


@pytest.mark.parametrize(
    "usage_type, inference_type, feature, expected",
    [
        ("USE1-NovaPro-input-tokens", "Input tokens", "On-demand Inference", (IN_REGION, "input")),
        (
            "USE1-Claude4.5Sonnet-output-tokens-cross-region-global",
            "Output tokens",
            "On-demand Inference",
            (GLOBAL, "output"),
        ),
        (
            "USW2-xai.grok-4.6-input-tokens-global-standard",
            "Input tokens global",
            "On-demand Inference",
            (GLOBAL, "input"),
        ),
        (
            "USE1-Claude4.5Sonnet-cache-read-input-token-count-cross-region-geo",
            "Cache read input tokens",
            "On-demand Inference",
            (GEOGRAPHIC, "cache_read"),
        ),
        ("USE1-NovaPro-input-tokens-standard", "Input tokens", "On-demand Inference", (IN_REGION, "input")),
        (
            "USE1-Claude4.5Sonnet-reserved-3-month-input-tokens-per-minute-cross-region-geo",
            "Input tokens",
            "On-demand Inference",
            None,
        ),
        # each other offer, under its usage type
        (
            "USE1-Claude4Sonnet-input-tokens-lctx",
            "Input tokens",
            "On-demand Inference",
            (IN_REGION, "input", "long_context"),
        ),
        (
            "USE1-NovaPro-output-tokens-priority",
            "Output tokens priority",
            "On-demand Inference",
            (IN_REGION, "output", "priority"),
        ),
        ("USE1-Qwen3-32B-input-tokens-flex", "Input tokens flex", "On-demand Inference", (IN_REGION, "input", "flex")),
        ("USE1-Qwen3-32B-input-tokens-batch", "Input tokens", "Batch Inference", (IN_REGION, "input", "batch")),
        (
            "USE1-Nova2.0Lite-input-tokens-cross-region-global-batch",
            "Input tokens",
            "Batch Inference",
            (GLOBAL, "input", "batch"),
        ),
        (
            "USW2-Nova2.0Lite-input-tokens-priority-cross-region-global",
            "Input tokens priority",
            "On-demand Inference",
            (GLOBAL, "input", "priority"),
        ),
        (
            "USE1-Claude4Sonnet-cache-write-input-token-count-long-context-cross-region-global",
            "Cache write input tokens",
            "On-demand Inference",
            (GLOBAL, "cache_write", "long_context"),
        ),
        (
            "USE1-Claude4.5Sonnet-cache-write-1h-input-token-count",
            "Cache write input tokens",
            "On-demand Inference",
            (IN_REGION, "cache_write_1h"),
        ),
        (
            "USE1-Llama3-1-70B-LatencyOptimized-input-tokens",
            "Input tokens",
            "On-demand Inference",
            (IN_REGION, "input", "latency_optimized"),
        ),
        ("USE1-NovaPro-ProvisionedThroughput", "Model units", "Provisioned Throughput", None),
        ("USE1-qwen.qwen3-32b-mantle-input-tokens-priority", "Input tokens priority", "", None),
        ("USE1-NovaLite-input-tokens-custom-model", "Input tokens", "Model Customization", None),
    ],
)
def test_usage_types_are_classified_by_kind_and_offer(usage_type, inference_type, feature, expected):
    classified = price_list.classify({"usagetype": usage_type, "inferenceType": inference_type, "feature": feature})
    assert classified == (price_list.Classified(*expected) if expected else None)


def stub_price_list(pages_by_model: dict[str, list[list[str]]]):
    """A pricing client answering GetProducts per model name with the given pages."""
    client = boto3.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    asked = [name for name in pages_by_model if not name.endswith(price_list.LATENCY_OPTIMIZED_MODEL)]
    for name in price_list.price_list_queries(asked):  # each model, then its latency-optimized offer
        pages = pages_by_model.get(name, [[]])
        for number, entries in enumerate(pages):
            expected = {
                "ServiceCode": "AmazonBedrock",
                "FormatVersion": "aws_v1",
                "Filters": [{"Type": "TERM_MATCH", "Field": "model", "Value": name}],
            }
            response = {"FormatVersion": "aws_v1", "PriceList": entries}
            if number:
                expected["NextToken"] = f"{name}-page-{number}"
            if number + 1 < len(pages):
                response["NextToken"] = f"{name}-page-{number + 1}"
            stubber.add_response("get_products", response, expected)
    stubber.activate()
    return client, stubber


def configured_price_list_pages() -> dict[str, list[list[str]]]:
    return {
        "Nova Pro": [NOVA_PRO[:5], NOVA_PRO[5:]],
        "Nova 2.0 Lite": [
            [
                product("Nova 2.0 Lite", "us-east-1", "Input tokens", "0.00033"),
                product("Nova 2.0 Lite", "us-east-1", "Output tokens", "0.00275"),
            ]
        ],
        "Nova Micro": [[]],
    }


NOW = datetime(2026, 1, 23, 15, 30, tzinfo=UTC)


def pricing_item(model_id: str, key: str) -> dict | None:
    return table(tables.PRICING_CACHE).get_item(Key={"model_id": model_id, "price_key": key}).get("Item")


def test_fetcher_writes_region_and_default_prices_for_every_day_in_play(aws):
    client, stubber = stub_price_list(configured_price_list_pages())
    with only_granted("pricing_fetcher"):
        report = pricing.refresh_pricing_cache(NOW, client)
    stubber.assert_no_pending_responses()
    assert report["status"] == "ok" and report["models"] == 2
    days = [day.isoformat() for day in org_days_in_play(NOW)]
    assert days == ["2026-01-21", "2026-01-22", "2026-01-23", "2026-01-24"]
    for day in days:
        default = pricing_item("amazon.nova-pro-v1:0", day)
        assert default["input_price_usd_micros_per_1m"] == 800_000
        assert default["output_price_usd_micros_per_1m"] == 3_200_000
        assert default["cache_read_price_usd_micros_per_1m"] == 200_000
        assert pricing_item("amazon.nova-pro-v1:0", f"{day}#eu-west-1")["input_price_usd_micros_per_1m"] == 1_050_000
        lite = pricing_item("amazon.nova-2-lite-v1:0", f"{day}#us-east-1")
        assert lite["output_price_usd_micros_per_1m"] == 2_750_000
        assert pricing_item("amazon.nova-micro-v1:0", day) is None  # not in the Price List: config serves
    item = pricing_item("amazon.nova-pro-v1:0", "2026-01-23")
    assert item["expires_at_epoch"] == int(NOW.timestamp()) + 3 * 86400
    assert item["model_label"] in ("premium", "ultra_premium") and item["family"] == "nova"
    # 2 models with a price; Nova Pro in 2 regions (+ default), Nova 2.0 Lite in 1 (+ default), 4 days
    assert report["written"] == (3 + 2) * 4


def test_a_days_price_once_written_is_kept(aws):
    client, _ = stub_price_list(configured_price_list_pages())
    pricing.refresh_pricing_cache(NOW, client)
    cheaper = {
        "Nova Pro": [
            [
                product("Nova Pro", "us-east-1", "Input tokens", "0.0001"),
                product("Nova Pro", "us-east-1", "Output tokens", "0.0001"),
            ]
        ],
        "Nova 2.0 Lite": [[]],
        "Nova Micro": [[]],
    }
    client, _ = stub_price_list(cheaper)
    report = pricing.refresh_pricing_cache(NOW + timedelta(days=1), client)
    assert pricing_item("amazon.nova-pro-v1:0", "2026-01-23")["input_price_usd_micros_per_1m"] == 800_000
    assert pricing_item("amazon.nova-pro-v1:0", "2026-01-25")["input_price_usd_micros_per_1m"] == 100_000
    assert (report["written"], report["kept"]) == (2, 6)  # 24th, 25th new (x2 keys); 22nd-24th kept


def test_a_kind_learned_later_is_added_to_a_day_without_changing_its_prices(aws):
    client, _ = stub_price_list(configured_price_list_pages())
    pricing.refresh_pricing_cache(NOW, client)
    with_global = {
        "Nova Pro": [
            [
                product("Nova Pro", "us-east-1", "Input tokens", "0.0001"),
                product("Nova Pro", "us-east-1", "Output tokens", "0.0001"),
                product(
                    "Nova Pro", "us-east-1", "Input tokens", "0.00072", usage_suffix="input-tokens-cross-region-global"
                ),
                product(
                    "Nova Pro",
                    "us-east-1",
                    "Output tokens",
                    "0.00288",
                    usage_suffix="output-tokens-cross-region-global",
                ),
            ]
        ],
        "Nova 2.0 Lite": [[]],
        "Nova Micro": [[]],
    }
    client, _ = stub_price_list(with_global)
    report = pricing.refresh_pricing_cache(NOW, client)
    item = pricing_item("amazon.nova-pro-v1:0", "2026-01-23#us-east-1")
    assert item["input_price_usd_micros_per_1m"] == 800_000  # the day's price stays
    assert (item["global_input_price_usd_micros_per_1m"], item["global_output_price_usd_micros_per_1m"]) == (
        720_000,
        2_880_000,
    )
    assert (report["written"], report["kept"]) == (8, 0)  # 4 days x (region + default key), each gained GLOBAL
    client, _ = stub_price_list(with_global)
    assert pricing.refresh_pricing_cache(NOW, client)["written"] == 0  # nothing new: no write


def test_a_price_change_announced_ahead_lands_on_its_day(aws):
    client, _ = stub_price_list({"Nova Pro": [[]], "Nova Micro": [[]], "Nova 2.0 Lite": [NOVA_2_LITE]})
    pricing.refresh_pricing_cache(NOW, client)  # the 24th is written today, with the term in effect then
    assert pricing_item("amazon.nova-2-lite-v1:0", "2026-01-23")["output_price_usd_micros_per_1m"] == 2_750_000
    assert pricing_item("amazon.nova-2-lite-v1:0", "2026-01-24")["output_price_usd_micros_per_1m"] == 2_500_000


def test_price_list_failure_writes_nothing_and_config_prices_keep_serving(api, monkeypatch):
    client = boto3.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    stubber.add_client_error("get_products", "AccessDeniedException", "not authorized", 400)
    stubber.activate()
    monkeypatch.setattr(price_list, "pricing_client", lambda: client)
    report = load_handler("pricing_fetcher")({"source": "aws.events"}, LambdaContext("pricing_fetcher"))
    assert report == {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    assert table(tables.PRICING_CACHE).scan()["Items"] == []
    tenant = new_tenant()
    reply = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token)
    assert reply.status == 202, reply
    assert reply.json()["pricing"]["source"] == "CONFIG_FALLBACK"
    assert reply.json()["processing"]["cost_usd_micros"] == 3760  # 1500 x 0.80 + 800 x 3.20 per 1M


# --- the price of the day ----------------------------------------------------------


def put_price(model_id: str, key: str, input_price: int, output_price: int, kind: str = IN_REGION) -> None:
    table(tables.PRICING_CACHE).update_item(
        Key={"model_id": model_id, "price_key": key},
        UpdateExpression="SET #i = :i, #o = :o",
        ExpressionAttributeNames={
            "#i": pricing.price_attribute(kind, "input"),
            "#o": pricing.price_attribute(kind, "output"),
        },
        ExpressionAttributeValues={":i": input_price, ":o": output_price},
    )


FALLBACK = Prices(800_000, 3_200_000, 200_000, 800_000)
CONFIGURED = {IN_REGION: FALLBACK}


def test_region_price_first_then_the_days_default_then_config(aws):
    assert pricing.quote("m", DAY, "eu-west-1", IN_REGION, CONFIGURED).source == "CONFIG_FALLBACK"
    pricing._stored.clear()
    put_price("m", "2026-01-23", 1_000_000, 4_000_000)
    default = pricing.quote("m", DAY, "eu-west-1", IN_REGION, CONFIGURED)
    assert (default.source, default.prices) == ("PRICING_API", Prices(1_000_000, 4_000_000, 200_000, 800_000))
    pricing._stored.clear()
    put_price("m", "2026-01-23#eu-west-1", 1_050_000, 4_200_000)
    regional = pricing.quote("m", DAY, "eu-west-1", IN_REGION, CONFIGURED)
    assert regional.prices.input == 1_050_000 and regional.version == "2026-01-23"
    assert pricing.quote("m", DAY, None, IN_REGION, CONFIGURED).prices.input == 1_000_000
    assert pricing.quote("m", date(2026, 1, 24), None, IN_REGION, CONFIGURED).source == "CONFIG_FALLBACK"


def test_quotes_are_cached_in_memory(aws):
    put_price("m", "2026-01-23", 1_000_000, 4_000_000)
    assert pricing.quote("m", DAY, None, IN_REGION, CONFIGURED).prices.input == 1_000_000
    table(tables.PRICING_CACHE).delete_item(Key={"model_id": "m", "price_key": "2026-01-23"})
    assert pricing.quote("m", DAY, None, IN_REGION, CONFIGURED).prices.input == 1_000_000


GLOBAL_CONFIG = Prices(700_000, 2_800_000, 175_000, 700_000)


@pytest.mark.parametrize(
    "stored, configured, kind, expected",
    [
        # the kind's own Price List price, its cache prices from the config's price of that kind
        (
            {IN_REGION: (800_000, 3_200_000), GLOBAL: (720_000, 2_880_000)},
            {**CONFIGURED, GLOBAL: GLOBAL_CONFIG},
            GLOBAL,
            ("PRICING_API", Prices(720_000, 2_880_000, 175_000, 700_000)),
        ),
        # none in the Price List: the kind's config price before the in-region Price List one
        (
            {IN_REGION: (810_000, 3_240_000)},
            {**CONFIGURED, GLOBAL: GLOBAL_CONFIG},
            GLOBAL,
            ("CONFIG_FALLBACK", GLOBAL_CONFIG),
        ),
        # no price of the kind anywhere: priced as in-region (global is cheaper: never under-counted)
        (
            {IN_REGION: (810_000, 3_240_000)},
            CONFIGURED,
            GLOBAL,
            ("PRICING_API", Prices(810_000, 3_240_000, 200_000, 800_000)),
        ),
        ({}, CONFIGURED, GEOGRAPHIC, ("CONFIG_FALLBACK", FALLBACK)),
        (
            {GEOGRAPHIC: (880_000, 3_520_000)},
            CONFIGURED,
            GEOGRAPHIC,
            ("PRICING_API", Prices(880_000, 3_520_000, 200_000, 800_000)),
        ),
        # a model outside config.yaml: the Price List, else the configured estimate
        ({GLOBAL: (720_000, 2_880_000)}, None, GLOBAL, ("PRICING_API", Prices(720_000, 2_880_000, 0, 0))),
        ({}, None, GLOBAL, ("ESTIMATE", get_config().unknown_model_estimate)),
    ],
)
def test_each_profile_kind_is_priced_by_its_own_price_first(aws, stored, configured, kind, expected):
    for stored_kind, (input_price, output_price) in stored.items():
        put_price("m", "2026-01-23#us-east-1", input_price, output_price, stored_kind)
    quote = pricing.quote("m", DAY, "us-east-1", kind, configured)
    assert (quote.source, quote.prices) == expected
    assert quote.profile_kind == kind and quote.as_response()["profile_kind"] == kind


def _label(input_price: int, output_price: int) -> dict:
    return {
        "type": "model",
        "id": f"vendor.m{input_price}",
        "input_price_usd_micros_per_1m": input_price,
        "output_price_usd_micros_per_1m": output_price,
    }


def test_the_estimate_floor_is_never_below_a_label_price():
    labels = {"a": _label(100, 900), "b": _label(300, 200)}
    assert parse_config({"model_labels": labels}).unknown_model_estimate == Prices(300, 900, 0, 0)
    floor = {"input_price_usd_micros_per_1m": 200, "output_price_usd_micros_per_1m": 5_000}
    configured = parse_config({"model_labels": labels, "unknown_model_estimate": floor})
    assert configured.unknown_model_estimate == Prices(300, 5_000, 0, 0)
    shipped = get_config()
    assert all(
        getattr(shipped.unknown_model_estimate, c) >= getattr(label.prices, c)
        for label in shipped.labels.values()
        for c in Prices._fields
    )


def test_usage_is_priced_from_the_pricing_cache(api):
    tenant = new_tenant()
    today = org_date("America/New_York")
    put_price("amazon.nova-pro-v1:0", today.isoformat(), 1_000_000, 4_000_000)
    put_price("amazon.nova-pro-v1:0", f"{today.isoformat()}#eu-west-1", 2_000_000, 8_000_000)
    plain = api.post(tenant.app_path + "/usage", usage_body(input_tokens=1000, output_tokens=1000), token=tenant.token)
    assert plain.json()["pricing"] == {
        "source": "PRICING_API",
        "version": today.isoformat(),
        "profile_kind": "IN_REGION",
        "service_tier": "default",
        "latency_optimized": False,
        "inference_type": "ON_DEMAND",
        "long_context": False,
        "rates": {
            "input_price_usd_micros_per_1m": 1_000_000,
            "output_price_usd_micros_per_1m": 4_000_000,
            "cache_read_price_usd_micros_per_1m": 200_000,  # the components it lacks: config.yaml's
            "cache_write_price_usd_micros_per_1m": 800_000,
            "cache_write_1h_price_usd_micros_per_1m": 0,
        },
    }
    assert plain.json()["processing"]["cost_usd_micros"] == 5_000
    regional = api.post(
        tenant.app_path + "/usage",
        usage_body(input_tokens=1000, output_tokens=1000, calling_region="eu-west-1"),
        token=tenant.token,
    )
    assert regional.json()["processing"]["cost_usd_micros"] == 10_000
