"""The client library against the real local server and the scope's total cap:
a cached NORMAL choice must not outlive the total cap. Bedrock is a real bedrock-runtime
client answered by botocore's Stubber."""

from __future__ import annotations

import pytest

from price_keeper_client import QuotaExceeded

from .conftest import FakeClock, converse_response, provision, stubbed_bedrock, wait_for
from .test_runtime_server import MESSAGES, make_keeper, usage

pytestmark = pytest.mark.e2e

PREMIUM_COST = 3760  # 1,500 input and 800 output tokens of premium (config.yaml)
TOTAL_CAP = 10_000  # under three calls, while premium alone could take 10 M


def test_converse_stops_at_the_total_cap_while_the_label_is_far_from_its_quota(server):
    # One client caches a NORMAL choice; another client of the same app then spends the total
    # cap. The cached choice outlives the cap by one call at most, whenever the aggregator folds.
    _, creds = provision(server, total_quota_usd_micros=TOTAL_CAP)
    bedrock, stubber = stubbed_bedrock()
    keeper, calls = make_keeper(server, creds, bedrock_client=bedrock, monotonic=FakeClock())  # time stands still
    assert keeper.select_model().mode == "NORMAL"

    other_bedrock, other_stubber = stubbed_bedrock()
    other, other_calls = make_keeper(server, creds, bedrock_client=other_bedrock, monotonic=FakeClock())
    spent = 0
    while spent < TOTAL_CAP:  # 3 calls: 11,280 of a 10,000 cap, premium at 0.1 % of its quota
        other_stubber.add_response("converse", converse_response(input_tokens=1500, output_tokens=800))
        spent += other.converse(messages=MESSAGES).receipt.cost_usd_micros
    # every answer before the third showed at most 7,520 (under the 95 % tight line): one selection
    assert spent == 3 * PREMIUM_COST and other_calls.count("GET", "/model-selection") == 1
    assert wait_for(lambda: keeper.daily_spend().total_cost_usd_micros == spent), "the aggregator never folded"

    stubber.add_response("converse", converse_response(input_tokens=1500, output_tokens=800))
    answered = keeper.converse(messages=MESSAGES)  # the choice cached before the cap was spent: one more call
    total = answered.receipt.total
    assert total.spend_usd_micros in (spent, spent + PREMIUM_COST)  # folded, with or without this very call
    assert (total.quota_usd_micros, total.status) == (TOTAL_CAP, "EXCEEDED")
    assert answered.receipt.quota.status == "NORMAL"  # premium itself is far from its quota
    with pytest.raises(QuotaExceeded) as refused:  # the usage answer dropped the cached choice
        keeper.converse(messages=MESSAGES)
    assert refused.value.code == "QUOTA_EXCEEDED"
    stubber.assert_no_pending_responses()  # Bedrock was not called again
    assert calls.count("GET", "/model-selection") == 2
    assert keeper.close() and other.close()


def test_a_batch_answer_showing_the_total_tight_makes_the_client_ask_again(server):
    # tight from 50 % of a 10,000 cap: 2 premium calls (7,520) make the total tight, premium stays NORMAL
    _, creds = provision(server, total_quota_usd_micros=TOTAL_CAP, overrides={"tight_mode_threshold_pct": 50})
    bedrock, stubber = stubbed_bedrock()
    keeper, calls = make_keeper(server, creds, bedrock_client=bedrock, monotonic=FakeClock())
    assert keeper.select_model().mode == "NORMAL"
    for _ in range(2):
        stubber.add_response("converse", converse_response(input_tokens=1500, output_tokens=800))
        keeper.converse(messages=MESSAGES)
    assert wait_for(lambda: keeper.daily_spend().total_cost_usd_micros == 2 * PREMIUM_COST)
    (batch,) = keeper.report_usage_batch([usage(input_tokens=10)])
    assert batch.total is not None and batch.total.status == "TIGHT"
    assert [quota.status for quota in batch.quotas] == ["NORMAL"]  # premium itself is far from its quota
    choice = keeper.select_model()  # the batch answer dropped the cached NORMAL choice
    assert calls.count("GET", "/model-selection") == 2 and choice.mode == "TIGHT"
    assert keeper.close()
