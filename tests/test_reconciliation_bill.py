"""The optional bill comparison (``domain.bill``): Cost Explorer's cost per cost-allocation tag
value (botocore's Stubber with GetCostAndUsage answers shaped as AWS sends them; moto's Cost
Explorer answers only canned results) against usage metered through the real metering and
aggregator on moto, for an application inference profile an org registered."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from price_keeper import state
from price_keeper.aws import client as aws_client
from price_keeper.config import Reconciliation, config_path, get_config
from price_keeper.domain import bill, orgs, profiles
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import item_size, table
from tests.factories import seed_app, seed_org
from tests.usage_support import iso, submit_and_fold

TAG = "price-keeper-profile"


def read_config() -> str:
    return config_path().read_text()


def cost_and_usage(groups: dict[str, str], token: str | None = None) -> dict:
    """A GetCostAndUsage answer grouped by one tag, as AWS sends it (amounts are strings)."""
    answer = {
        "GroupDefinitions": [{"Type": "TAG", "Key": TAG}],
        "ResultsByTime": [
            {
                "TimePeriod": {"Start": "2026-11-20", "End": "2026-11-21"},
                "Total": {},
                "Groups": [
                    {"Keys": [f"{TAG}${value}"], "Metrics": {"UnblendedCost": {"Amount": amount, "Unit": "USD"}}}
                    for value, amount in groups.items()
                ],
                "Estimated": True,
            }
        ],
        "DimensionValueAttributes": [],
    }
    if token:
        answer["NextPageToken"] = token
    return answer


@pytest.fixture
def tagged(aws, monkeypatch, bedrock_endpoint, tmp_path):
    """An org whose app registered an application profile (copy of Nova Micro) as "micro", with
    the bill comparison on for ``TAG`` (config.yaml's ``bill_tag_key``)."""
    config = tmp_path / "config.yaml"
    config.write_text(read_config().replace('bill_tag_key: ""', f"bill_tag_key: {TAG}"))
    monkeypatch.setenv("PRICE_KEEPER_CONFIG", str(config))
    state.reset()
    assert get_config().reconciliation.bill_tag_key == TAG
    org_id = seed_org(timezone="UTC")
    seed_app(org_id, "app-1")
    arn = boto3.client("bedrock", endpoint_url=bedrock_endpoint).create_inference_profile(
        inferenceProfileName="micro",
        modelSource={"copyFrom": "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-micro-v1:0"},
    )["inferenceProfileArn"]
    profiles.register(orgs.effective_config(org_id, "app-1"), "micro", arn, None)
    yield org_id, arn
    state.reset()


def report(org_id: str, arn: str, at: datetime, input_tokens: int, output_tokens: int) -> None:
    profile = {"model_label": "micro", "bedrock_model_id": arn, "calling_region": "us-east-1"}
    tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    submit_and_fold(org_id, "app-1", at, timestamp=iso(at), **profile, **tokens)


def test_billed_spend_beyond_the_metered_is_shown_per_profile(tagged):
    org_id, arn = tagged
    profile_id = arn.rsplit("/", 1)[1]
    noon = datetime(2026, 11, 20, 12, tzinfo=UTC)
    report(org_id, arn, noon, 1_000_000, 100_000)  # 0.035 + 0.014 USD (config.yaml economy prices)
    ce = aws_client("ce")
    with Stubber(ce) as stubber:
        request = {
            "TimePeriod": {"Start": "2026-11-20", "End": "2026-11-21"},
            "Granularity": "DAILY",
            "Metrics": ["UnblendedCost"],
            "GroupBy": [{"Type": "TAG", "Key": TAG}],
        }
        stubber.add_response("get_cost_and_usage", cost_and_usage({profile_id: "0.0490000000"}, "next"), request)
        stubber.add_response(
            "get_cost_and_usage",
            cost_and_usage({"other0profile": "1.25", "": "7.5"}),
            {**request, "NextPageToken": "next"},
        )
        result = bill.run(datetime(2026, 11, 23, 6, tzinfo=UTC))
    assert {row["profile_id"]: row for row in result["profiles"]} == {
        "other0profile": {"profile_id": "other0profile", "billed_usd_micros": 1_250_000, "metered_usd_micros": 0,
                          "unmetered_usd_micros": 1_250_000},
        profile_id: {"profile_id": profile_id, "billed_usd_micros": 49_000, "metered_usd_micros": 49_000,
                     "unmetered_usd_micros": 0},
    }  # fmt: skip
    summary, rows = kept_bill("20261120")
    assert (summary["date"], summary["tag_key"], summary["rows"], rows) == (
        "2026-11-20",
        TAG,
        2,
        result["profiles"],
    )


def kept_bill(day: str) -> tuple[dict, list[dict]]:
    """The comparison's summary item and its profile rows, page after page."""
    totals = table(tables.DAILY_TOTAL)
    summary = totals.get_item(Key=keys.bill_key(day))["Item"]
    pages = [totals.get_item(Key=keys.page_key(keys.bill_key(day), n))["Item"] for n in range(int(summary["pages"]))]
    return summary, [row for page in pages for row in page["profiles"]]


@pytest.mark.slow  # volume: make test
def test_a_fleets_tagged_profiles_are_kept_in_pages_under_the_item_size_limit(tagged):
    """5,000 tagged profiles (~650 KB of rows, past DynamoDB's 400 KB an item) are kept in
    pages of 500 rows and a summary."""
    billed = {f"profile{n:020d}": "1.5" for n in range(5_000)}
    with Stubber(aws_client("ce")) as stubber:
        stubber.add_response("get_cost_and_usage", cost_and_usage(billed))
        result = bill.run(datetime(2026, 11, 23, 6, tzinfo=UTC))
    summary, rows = kept_bill("20261120")
    assert (summary["rows"], summary["pages"], len(rows)) == (5_000, 10, 5_000)
    assert rows == result["profiles"] and rows[0]["unmetered_usd_micros"] == 1_500_000
    assert (
        max(
            item_size(table(tables.DAILY_TOTAL).get_item(Key=keys.page_key(keys.bill_key("20261120"), n))["Item"])
            for n in range(10)
        )
        < 400_000
    )


def test_without_a_tag_key_nothing_is_asked(aws):
    assert get_config().reconciliation.bill_tag_key == Reconciliation().bill_tag_key == ""
    with Stubber(aws_client("ce")):  # answers nothing: any call would raise
        assert bill.run(datetime(2026, 11, 23, tzinfo=UTC)) is None
