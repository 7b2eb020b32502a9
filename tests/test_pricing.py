"""Cost maths, Price List parsing, the pricing fetcher (botocore Stubber with responses
shaped like the real GetProducts ones) and the price-of-the-day lookup (moto)."""
from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from fractions import Fraction

import boto3
import pytest
from botocore.stub import Stubber
from hypothesis import given
from hypothesis import strategies as st

from local.gateway import LambdaContext, load_handler
from price_keeper import pricing, tables
from price_keeper.aws import table
from price_keeper.config import Prices, get_config
from price_keeper.errors import ApiError
from price_keeper.timeutil import org_date, org_days_in_play
from tests.conftest import assert_error
from tests.iam_check import only_granted
from tests.test_profiles import register, stub_bedrock
from tests.usage_support import new_tenant, usage_body

# --- cost maths --------------------------------------------------------------------


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


@pytest.mark.parametrize(("usd", "unit", "micros"), [
    ("0.0008000000", "1K tokens", 800_000),
    ("0.00033", "1K tokens", 330_000),
    ("0.000035", "1K tokens", 35_000),
    ("0.80", "1M tokens", 800_000),
    ("0.0000008", "tokens", 800_000),
    ("0.0000000005", "1K tokens", 1),  # 0.5 micro-USD per 1M: half up
])
def test_price_list_units_become_micro_usd_per_million_tokens(usd, unit, micros):
    assert pricing.micros_per_1m(usd, unit) == micros


# --- the Price List ----------------------------------------------------------------

REGION_NAMES = {"us-east-1": ("USE1", "US East (N. Virginia)"), "eu-west-1": ("EU", "EU (Ireland)")}


def product(model: str, region: str, inference_type: str, usd: str, *, unit: str = "1K tokens",
            usage_suffix: str | None = None, feature: str = "On-demand Inference") -> str:
    """One ``PriceList`` entry as GetProducts returns it (a JSON string)."""
    prefix, location = REGION_NAMES[region]
    suffix = usage_suffix or inference_type.lower().replace(" ", "-")
    sku = f"SKU{abs(hash((model, region, inference_type, suffix))) % 10**10:010d}"
    return json.dumps({
        "product": {
            "productFamily": "Amazon Bedrock",
            "attributes": {
                "servicecode": "AmazonBedrock", "servicename": "Amazon Bedrock", "operation": "Usage",
                "usagetype": f"{prefix}-{model.replace(' ', '')}-{suffix}", "location": location,
                "locationType": "AWS Region", "regionCode": region, "model": model,
                "inferenceType": inference_type, "feature": feature,
            },
            "sku": sku,
        },
        "serviceCode": "AmazonBedrock",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": f"{model} {inference_type}", "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                "pricePerUnit": {"USD": usd},
            }},
            "sku": sku, "effectiveDate": "2026-01-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {},
        }}},
        "version": "20260101000000",
        "publicationDate": "2026-01-01T00:00:00Z",
    })


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
    parsed = pricing.parse_price_list(
        NOVA_PRO + [product("Titan Text", "us-east-1", "Input tokens", "0.0003"),
                    product("Nova Micro", "eu-west-1", "Input tokens", "0.000046")],  # no output price
        {"Nova Pro", "Nova Micro"})
    assert parsed == {
        ("Nova Pro", "us-east-1"): Prices(800_000, 3_200_000, 200_000, 800_000),
        ("Nova Pro", "eu-west-1"): Prices(1_050_000, 4_200_000, 0, 0),
    }


def stub_price_list(pages_by_model: dict[str, list[list[str]]]):
    """A pricing client answering GetProducts per model name with the given pages."""
    client = boto3.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    for name in sorted(pages_by_model):
        pages = pages_by_model[name]
        for number, entries in enumerate(pages):
            expected = {"ServiceCode": "AmazonBedrock", "FormatVersion": "aws_v1",
                        "Filters": [{"Type": "TERM_MATCH", "Field": "model", "Value": name}]}
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
        "Nova 2.0 Lite": [[product("Nova 2.0 Lite", "us-east-1", "Input tokens", "0.00033"),
                           product("Nova 2.0 Lite", "us-east-1", "Output tokens", "0.00275")]],
        "Nova Micro": [[]],
    }


NOW = datetime(2026, 1, 23, 15, 30, tzinfo=timezone.utc)


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
    cheaper = {"Nova Pro": [[product("Nova Pro", "us-east-1", "Input tokens", "0.0001"),
                             product("Nova Pro", "us-east-1", "Output tokens", "0.0001")]],
               "Nova 2.0 Lite": [[]], "Nova Micro": [[]]}
    client, _ = stub_price_list(cheaper)
    report = pricing.refresh_pricing_cache(NOW + timedelta(days=1), client)
    assert pricing_item("amazon.nova-pro-v1:0", "2026-01-23")["input_price_usd_micros_per_1m"] == 800_000
    assert pricing_item("amazon.nova-pro-v1:0", "2026-01-25")["input_price_usd_micros_per_1m"] == 100_000
    assert (report["written"], report["kept"]) == (2, 6)  # 24th, 25th new (x2 keys); 22nd-24th kept


def test_price_list_failure_writes_nothing_and_config_prices_keep_serving(api, monkeypatch):
    client = boto3.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    stubber.add_client_error("get_products", "AccessDeniedException", "not authorized", 400)
    stubber.activate()
    monkeypatch.setattr(pricing, "pricing_client", lambda: client)
    report = load_handler("pricing_fetcher")({"source": "aws.events"}, LambdaContext("pricing_fetcher"))
    assert report == {"status": "unavailable", "written": 0, "kept": 0, "models": 0}
    assert table(tables.PRICING_CACHE).scan()["Items"] == []
    tenant = new_tenant()
    reply = api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token)
    assert reply.status == 202, reply
    assert reply.json()["pricing"]["source"] == "CONFIG_FALLBACK"
    assert reply.json()["processing"]["cost_usd_micros"] == 3760  # 1500 x 0.80 + 800 x 3.20 per 1M


# --- the price of the day ----------------------------------------------------------

def put_price(model_id: str, key: str, input_price: int, output_price: int) -> None:
    table(tables.PRICING_CACHE).put_item(Item={"model_id": model_id, "price_key": key,
                                               "input_price_usd_micros_per_1m": input_price,
                                               "output_price_usd_micros_per_1m": output_price})


FALLBACK = Prices(800_000, 3_200_000, 200_000, 800_000)
DAY = date(2026, 1, 23)


def test_region_price_first_then_the_days_default_then_config(aws):
    assert pricing.quote("m", DAY, "eu-west-1", FALLBACK).source == "CONFIG_FALLBACK"
    pricing._quotes.clear()
    put_price("m", "2026-01-23", 1_000_000, 4_000_000)
    default = pricing.quote("m", DAY, "eu-west-1", FALLBACK)
    assert (default.source, default.prices) == ("PRICING_API", Prices(1_000_000, 4_000_000, 200_000, 800_000))
    pricing._quotes.clear()
    put_price("m", "2026-01-23#eu-west-1", 1_050_000, 4_200_000)
    regional = pricing.quote("m", DAY, "eu-west-1", FALLBACK)
    assert regional.prices.input == 1_050_000 and regional.version == "2026-01-23"
    assert pricing.quote("m", DAY, None, FALLBACK).prices.input == 1_000_000
    assert pricing.quote("m", date(2026, 1, 24), None, FALLBACK).source == "CONFIG_FALLBACK"


def test_quotes_are_cached_in_memory(aws):
    put_price("m", "2026-01-23", 1_000_000, 4_000_000)
    assert pricing.quote("m", DAY, None, FALLBACK).prices.input == 1_000_000
    table(tables.PRICING_CACHE).delete_item(Key={"model_id": "m", "price_key": "2026-01-23"})
    assert pricing.quote("m", DAY, None, FALLBACK).prices.input == 1_000_000


def test_a_model_without_any_price_cannot_be_metered(aws):
    with pytest.raises(ApiError) as raised:
        pricing.quote("unknown.model", DAY, "us-east-1", None)
    assert (raised.value.status, raised.value.code) == (400, "INVALID_CONFIG")


def test_usage_is_priced_from_the_pricing_cache(api):
    tenant = new_tenant()
    today = org_date("America/New_York")
    put_price("amazon.nova-pro-v1:0", today.isoformat(), 1_000_000, 4_000_000)
    put_price("amazon.nova-pro-v1:0", f"{today.isoformat()}#eu-west-1", 2_000_000, 8_000_000)
    plain = api.post(tenant.app_path + "/usage", usage_body(input_tokens=1000, output_tokens=1000), token=tenant.token)
    assert plain.json()["pricing"] == {"source": "PRICING_API", "version": today.isoformat()}
    assert plain.json()["processing"]["cost_usd_micros"] == 5_000
    regional = api.post(tenant.app_path + "/usage", usage_body(input_tokens=1000, output_tokens=1000,
                                                               calling_region="eu-west-1"), token=tenant.token)
    assert regional.json()["processing"]["cost_usd_micros"] == 10_000


def test_usage_with_an_unpriceable_registered_profile_is_invalid_config(api, monkeypatch):
    tenant = new_tenant()
    stub_bedrock(monkeypatch, {"us-east-1": "acme.unknown-model-v1:0"})
    assert register(api, tenant, "tenant-x").status == 201
    reply = api.post(tenant.app_path + "/usage", usage_body(model_label="tenant-x", calling_region="us-east-1"),
                     token=tenant.token)
    assert_error(reply, 400, "INVALID_CONFIG")
