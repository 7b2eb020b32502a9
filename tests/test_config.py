"""config.yaml parsing: defaults for what a file leaves out, refusals of what it gets wrong,
and the JSON copy the layer ships reading the same as the YAML people edit."""

import json

import pytest

from price_keeper.config import Prices, config_path, parse_config, read_raw

LABEL = {
    "type": "model",
    "id": "amazon.nova-pro-v1:0",
    "input_price_usd_micros_per_1m": 800_000,
    "output_price_usd_micros_per_1m": 3_200_000,
}


def test_a_file_with_only_labels_gets_every_default():
    config = parse_config({"model_labels": {"premium": LABEL}})
    assert config.alerts.thresholds_pct == (80, 95)
    assert config.metering.usage_agg_shard_count == 8 and config.metering.tight_mode_threshold_pct == 95
    assert config.rate_limits == {} and config.org_defaults == {}
    assert config.service_name == "bedrock-price-keeper"
    premium = config.labels["premium"]
    assert (premium.prices.input, premium.prices.output, premium.prices.cache_read) == (800_000, 3_200_000, 0)
    assert premium.configured_prices() == {"IN_REGION": premium.prices}  # cross-region kinds: as in-region
    assert config.unknown_model_estimate == premium.prices  # the highest label price


def test_cross_region_prices_and_the_estimate_are_read_per_kind():
    config = parse_config(
        {
            "model_labels": {
                "premium": {
                    **LABEL,
                    "cross_region_prices": {
                        "global": {
                            "input_price_usd_micros_per_1m": 720_000,
                            "output_price_usd_micros_per_1m": 2_880_000,
                        }
                    },
                },
                "economy": {
                    **LABEL,
                    "input_price_usd_micros_per_1m": 35_000,
                    "output_price_usd_micros_per_1m": 140_000,
                    "cache_read_price_usd_micros_per_1m": 900_000,
                },
            },
        }
    )
    assert config.labels["premium"].configured_prices() == {
        "IN_REGION": Prices(800_000, 3_200_000),
        "GLOBAL": Prices(720_000, 2_880_000),
    }
    assert config.unknown_model_estimate == Prices(800_000, 3_200_000, 900_000, 0)  # each component's highest
    explicit = parse_config(
        {
            "model_labels": {"premium": LABEL},
            "unknown_model_estimate": {
                "input_price_usd_micros_per_1m": 3_000_000,
                "output_price_usd_micros_per_1m": 15_000_000,
            },
        }
    )
    assert explicit.unknown_model_estimate == Prices(3_000_000, 15_000_000)


def test_alert_thresholds_are_sorted_and_deduplicated():
    config = parse_config({"model_labels": {}, "alerts": {"thresholds_pct": [95, 50, 95]}})
    assert config.alerts.thresholds_pct == (50, 95)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"alerts": {"thresholds_pct": [0]}}, "thresholds_pct"),
        ({"alerts": {"thresholds_pct": [True]}}, "thresholds_pct"),
        ({"model_labels": {"x": {**LABEL, "type": "engine"}}}, "type must be one of"),
        ({"model_labels": {"x": {**LABEL, "cross_region_prices": {"planet": {}}}}}, "cross_region_prices keys"),
        (
            {"model_labels": {"x": {**LABEL, "cross_region_prices": {"global": {"input_price_usd_micros_per_1m": 1}}}}},
            "cross_region_prices.global: output_price_usd_micros_per_1m",
        ),
        ({"model_labels": {"x": {**LABEL, "input_price_usd_micros_per_1m": -1}}}, "input_price_usd_micros_per_1m"),
        ({"unknown_model_estimate": {"input_price_usd_micros_per_1m": "high"}}, "unknown_model_estimate"),
        ({"model_labels": {"x": {**LABEL, "offers": {"turbo": {"pct": 200}}}}}, "offers keys must be among"),
        ({"model_labels": {"x": {**LABEL, "offers": {"flex": {"pct": 0}}}}}, "offers.flex: pct must be"),
        (
            {"model_labels": {"x": {**LABEL, "offers": {"flex": {"pct": 50, "input_price_usd_micros_per_1m": 1}}}}},
            "alone",
        ),
        (
            {"model_labels": {"x": {**LABEL, "offers": {"priority": {"input_price_usd_micros_per_1m": 1}}}}},
            "offers.priority: output_price_usd_micros_per_1m",
        ),
        ({"model_labels": {"x": {**LABEL, "long_context_threshold_tokens": 0}}}, "long_context_threshold_tokens"),
        ({"reserved_tier": {"count_at_on_demand": "yes"}}, "reserved_tier"),
        ({"reserved_tier": {"orgs": []}}, "reserved_tier: unknown settings"),
    ],
)
def test_mistakes_are_refused_with_the_setting_named(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_config(raw)


def test_an_unknown_metering_setting_is_refused():
    with pytest.raises(TypeError, match="shard_cout"):
        parse_config({"metering": {"shard_cout": 4}})


def test_the_json_the_layer_ships_reads_the_same_as_the_yaml(tmp_path):
    source = config_path()
    bundled = tmp_path / "config.json"
    bundled.write_text(json.dumps(read_raw(source)))
    assert parse_config(read_raw(bundled)) == parse_config(read_raw(source))


def test_each_offer_is_priced_explicitly_or_as_a_percentage_of_the_standard_prices():
    label = {
        **LABEL,
        "cache_read_price_usd_micros_per_1m": 200_000,
        "cache_write_price_usd_micros_per_1m": 1_000_000,
        "cache_write_1h_price_usd_micros_per_1m": 1_600_000,
        "long_context_threshold_tokens": 300_000,
        "offers": {
            "priority": {"pct": 175},
            "long_context": {"input_price_usd_micros_per_1m": 1_600_000, "output_price_usd_micros_per_1m": 4_800_000},
        },
    }
    config = parse_config({"model_labels": {"premium": label}})
    premium = config.labels["premium"]
    assert premium.prices == Prices(800_000, 3_200_000, 200_000, 1_000_000, 1_600_000)
    assert premium.offer_prices == {
        "priority": Prices(1_400_000, 5_600_000, 350_000, 1_750_000, 2_800_000),
        # the components left out at the offer's input ratio (2x here)
        "long_context": Prices(1_600_000, 4_800_000, 400_000, 2_000_000, 3_200_000),
    }
    assert premium.configured_prices()["IN_REGION/priority"] == premium.offer_prices["priority"]
    assert premium.long_context_threshold_tokens == 300_000
    # the estimate of an offer: at least every label's price of it
    assert config.unknown_model_offer_estimates["priority"] == premium.offer_prices["priority"]
    assert config.unknown_model_offer_estimates["flex"] == Prices(0, 0)


def test_reserved_calls_are_free_unless_the_config_counts_them_for_every_org_or_some():
    assert not parse_config({}).reserved_tier.at_on_demand("org")
    some = parse_config({"reserved_tier": {"orgs_at_on_demand": ["org"]}}).reserved_tier
    assert some.at_on_demand("org") and not some.at_on_demand("other")
    assert parse_config({"reserved_tier": {"count_at_on_demand": True}}).reserved_tier.at_on_demand("other")


def test_the_shipped_config_prices_the_offers_of_its_labels_and_a_high_estimate_of_any():
    shipped = parse_config(read_raw(config_path()))
    premium = shipped.labels["premium"]
    assert premium.offer_prices["priority"].input == premium.prices.input * 175 // 100
    assert premium.offer_prices["flex"].output == premium.prices.output // 2
    floor = shipped.unknown_model_estimate
    assert floor.cache_write_1h >= 2 * floor.input
    assert shipped.unknown_model_offer_estimates["long_context"].input >= 2 * floor.input
