"""``PriceKeeper(hard_cap=True)`` against the real local server: each Converse call reserves
its worst case (``inferenceConfig.maxTokens`` and the prompt's upper bound), calls the label
the reservation names, and its usage record settles the reservation; a call that failed
after reaching Bedrock settles what it used, one that never left the machine releases."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from price_keeper_client import QuotaExceeded
from price_keeper_client.bedrock import PROMPT_OVERHEAD_TOKENS, TOKENS_PER_MESSAGE, max_input_tokens

from .conftest import converse_response, provision, stubbed_bedrock
from .test_runtime_server import MESSAGES, PREMIUM, make_keeper

pytestmark = pytest.mark.e2e

STANDARD = "amazon.nova-2-lite-v1:0"


@pytest.fixture
def hard_cap(server):
    def make(**org_fields):
        _, creds = provision(server, **org_fields)
        bedrock, stubber = stubbed_bedrock()
        keeper, calls = make_keeper(server, creds, bedrock_client=bedrock, hard_cap=True)
        made.append(keeper)
        return keeper, stubber, calls

    made: list = []
    yield make
    for keeper in made:
        keeper.close()


def reserved_now(keeper, label: str = "premium") -> int:
    return next(item.reserved_usd_micros for item in keeper.daily_spend().labels if item.label == label)


def test_the_prompt_bound_counts_every_byte_and_the_overheads():
    system = [{"text": "Be brief. Ünïcode counts its bytes."}]
    bound = max_input_tokens(MESSAGES, {"system": system, "inferenceConfig": {"maxTokens": 5}})
    text_bytes = len(b"user") + len(b"Summarise the meeting notes") + len(system[0]["text"].encode())
    assert bound == text_bytes + TOKENS_PER_MESSAGE + PROMPT_OVERHEAD_TOKENS  # inferenceConfig is no prompt


def test_a_call_reserves_calls_the_reserved_label_and_settles(hard_cap):
    keeper, stubber, calls = hard_cap()
    stubber.add_response("converse", converse_response(input_tokens=40, output_tokens=100))
    result = keeper.converse(MESSAGES, inferenceConfig={"maxTokens": 300})
    (held,) = calls.bodies("POST", "/reservations")
    assert held == {
        "max_input_tokens": max_input_tokens(MESSAGES, {}),
        "max_output_tokens": 300,
        "calling_region": "us-east-1",  # the Bedrock client's: the hold is priced where the call goes
    }
    assert result.choice.bedrock_model_id == PREMIUM and result.choice.reason == "RESERVED"
    (reported,) = calls.bodies("POST", "/usage")
    assert reported["reservation_id"] == result.usage.reservation_id
    assert result.receipt.raw["reservation"]["settled"] is True
    assert result.receipt.raw["reservation"]["over_reservation_usd_micros"] == 0
    assert reserved_now(keeper) == 0


def test_a_call_the_quota_cannot_hold_never_reaches_bedrock(hard_cap):
    keeper, stubber, calls = hard_cap(quotas={"premium": 100, "standard": 100, "economy": 100})
    with pytest.raises(QuotaExceeded):
        keeper.converse(MESSAGES, inferenceConfig={"maxTokens": 4096})
    stubber.assert_no_pending_responses()
    assert calls.count("POST", "/usage") == 0


def test_a_call_that_never_left_releases_its_hold(hard_cap):
    keeper, _, calls = hard_cap()
    with pytest.raises(Exception) as raised:  # nothing stubbed: botocore refuses before sending
        keeper.converse(MESSAGES, inferenceConfig={"maxTokens": 300})
    assert not isinstance(raised.value, ClientError)
    assert calls.count("POST", "/reservations") == 1 and calls.count("DELETE", "") == 1
    assert calls.count("POST", "/usage") == 0
    assert reserved_now(keeper) == 0


def test_a_call_that_failed_at_bedrock_settles_what_it_used(hard_cap):
    keeper, stubber, calls = hard_cap()
    stubber.add_client_error("converse", "ThrottlingException", http_status_code=429)
    with pytest.raises(ClientError):
        keeper.converse(MESSAGES, inferenceConfig={"maxTokens": 300})
    (reported,) = calls.bodies("POST", "/usage")
    assert reported["status"] == "ERROR" and reported["reservation_id"]
    assert calls.count("DELETE", "") == 0
    assert reserved_now(keeper) == 0


def test_without_max_tokens_a_hard_capped_call_is_refused_before_anything(hard_cap):
    keeper, _, calls = hard_cap()
    with pytest.raises(ValueError, match="maxTokens"):
        keeper.converse(MESSAGES)
    assert calls.count("POST", "/reservations") == 0
