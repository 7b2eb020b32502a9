"""The runtime client against the real local server: model selection and its cache, guarded
Converse calls with exactly-once usage reporting, the background batch queue, and the typed
exception when every quota is spent. Bedrock is a real bedrock-runtime client answered by
botocore's Stubber."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import requests
from requests.adapters import HTTPAdapter

from price_keeper_client import PriceKeeper, QuotaExceeded, RetryPolicy, UsageRecord

from .conftest import (
    CallLog,
    FakeClock,
    converse_response,
    provision,
    stubbed_bedrock,
    wait_for,
    wait_for_quota_exceeded,
)

pytestmark = pytest.mark.e2e

PREMIUM = "amazon.nova-pro-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "Summarise the meeting notes"}]}]


def make_keeper(server, creds, **kwargs):
    session = kwargs.pop("session", None) or requests.Session()
    calls = CallLog(session)
    keeper = PriceKeeper(
        server.url,
        creds.client_id,
        creds.client_secret,
        session=session,
        retry=RetryPolicy(sleep=lambda seconds: None),
        **kwargs,
    )
    return keeper, calls


def usage(label="premium", model=PREMIUM, input_tokens=1000, output_tokens=0) -> UsageRecord:
    return UsageRecord(str(uuid.uuid4()), label, model, input_tokens, output_tokens, datetime.now(UTC))


def spend_reaches(keeper: PriceKeeper, requests_wanted: int):
    """Waits until the aggregator has folded at least ``requests_wanted`` requests into today's totals."""
    return wait_for(lambda: (lambda s: s if s.total_requests >= requests_wanted else None)(keeper.daily_spend()))


def test_selection_is_cached_as_the_service_advises(server):
    _, creds = provision(server)
    clock = FakeClock()
    keeper, calls = make_keeper(server, creds, monotonic=clock)
    choice = keeper.select_model()
    assert (choice.label, choice.bedrock_model_id, choice.reason, choice.mode) == (
        "premium",
        PREMIUM,
        "NORMAL",
        "NORMAL",
    )
    assert choice.cache_duration_secs == 300
    keeper.select_model()
    clock.advance(299)
    keeper.select_model()
    assert calls.count("GET", "/model-selection") == 1
    clock.advance(2)
    keeper.select_model()
    assert calls.count("GET", "/model-selection") == 2
    keeper.select_model(force=True)
    assert calls.count("GET", "/model-selection") == 3
    assert keeper.close()


def tight_from_half(server):
    """(keeper on a fake clock, its calls, the clock, the app's credentials) of an app whose
    premium quota is 10,000 micro-USD a day, tight from 50 %."""
    quotas = {"premium": 10_000, "standard": 5_000_000, "economy": 2_000_000}
    _, creds = provision(server, overrides={"tight_mode_threshold_pct": 50}, quotas=quotas)
    clock = FakeClock()
    keeper, calls = make_keeper(server, creds, monotonic=clock)
    return keeper, calls, clock, creds


def test_tight_mode_shortens_the_cache_to_a_minute(server):
    keeper, calls, clock, _ = tight_from_half(server)  # 7,500 input tokens at 0.8 micro-USD cost 6,000 (60 %)
    keeper.report_usage(usage(input_tokens=7_500))
    tight = wait_for(lambda: (lambda c: c if c.mode == "TIGHT" else None)(keeper.select_model(force=True)))
    assert tight is not None, "model selection never reported TIGHT mode"
    assert (tight.label, tight.cache_duration_secs) == ("premium", 60)
    asked = calls.count("GET", "/model-selection")
    clock.advance(59)
    keeper.select_model()
    assert calls.count("GET", "/model-selection") == asked
    clock.advance(2)
    keeper.select_model()
    assert calls.count("GET", "/model-selection") == asked + 1
    assert keeper.close()


def test_a_usage_answer_showing_the_label_tight_makes_the_client_ask_again(server):
    keeper, calls, _, creds = tight_from_half(server)
    assert keeper.select_model().mode == "NORMAL"
    # another client of the app spends 60 % of premium's quota: this one's cached choice
    # learns it from its own next usage answer, whenever the aggregator folds
    other, _ = make_keeper(server, creds, monotonic=FakeClock())
    other.report_usage(usage(input_tokens=7_500))
    assert spend_reaches(keeper, 1), "the aggregator never folded the usage"
    assert keeper.select_model().mode == "NORMAL"  # still the cached answer: no time has passed
    receipt = keeper.report_usage(usage(input_tokens=10))
    assert receipt.quota is not None and receipt.quota.status == "TIGHT"
    choice = keeper.select_model()
    assert choice.mode == "TIGHT" and choice.cache_duration_secs == 60
    assert calls.count("GET", "/model-selection") == 2
    assert keeper.close() and other.close()


def test_a_reporting_client_keeps_its_choice_fresh_with_its_reports_and_no_selection_requests(server):
    """An app calling every ~86 s (fleet shape): one selection request at the start, then every
    report that finds its cached choice past half its life asks for the selection with it."""
    _, creds = provision(server)
    clock = FakeClock()
    keeper, calls = make_keeper(server, creds, monotonic=clock)
    asked = []
    for _ in range(12):
        choice = keeper.select_model()
        assert (choice.label, choice.bedrock_model_id) == ("premium", PREMIUM)
        receipt = keeper.report_usage(usage())
        asked.append(receipt.selection is not None)
        if receipt.selection:
            assert receipt.selection.choice.label == "premium"
        clock.advance(86)
    assert calls.count("GET", "/model-selection") == 1 and calls.count("POST", "/usage") == 12
    # a 300 s choice: the reports at 0 s and 86 s find more than half of it left, the one at
    # 172 s asks and renews it, and from there every other report does
    assert asked == [False, False] + [True, False] * 5
    assert keeper.close()


class LoseFirstUsageAnswer(HTTPAdapter):
    """Delivers the first single usage report to the server, then drops the connection before
    the client reads the answer: the client cannot know whether it was counted."""

    def __init__(self):
        super().__init__()
        self.lost: list[str] = []
        self.sent: list[str] = []

    def send(self, request, **kwargs):
        response = super().send(request, **kwargs)
        if request.method == "POST" and request.path_url.endswith("/usage"):
            request_id = json.loads(request.body)["request_id"]
            self.sent.append(request_id)
            if not self.lost:
                self.lost.append(request_id)
                raise requests.ConnectionError("connection reset after the request was sent")
        return response


def test_converse_reports_usage_once_even_when_the_first_answer_is_lost(server):
    _, creds = provision(server)
    session = requests.Session()
    flaky = LoseFirstUsageAnswer()
    session.mount(server.url, flaky)
    bedrock, stubber = stubbed_bedrock()
    keeper, _ = make_keeper(server, creds, session=session, bedrock_client=bedrock)
    stubber.add_response(
        "converse",
        converse_response("Notes: ship it.", input_tokens=1500, output_tokens=800),
        expected_params={"modelId": PREMIUM, "messages": MESSAGES, "inferenceConfig": {"maxTokens": 256}},
    )
    stubber.add_response(
        "converse",
        converse_response("Second.", input_tokens=400, output_tokens=100),
        expected_params={"modelId": PREMIUM, "messages": MESSAGES},
    )

    first = keeper.converse(messages=MESSAGES, inferenceConfig={"maxTokens": 256})
    assert first.text == "Notes: ship it." and first.stop_reason == "end_turn"
    assert (first.choice.label, first.usage.input_tokens, first.usage.output_tokens) == ("premium", 1500, 800)
    assert flaky.sent == [first.usage.request_id] * 2  # delivered, answer lost, resent with the same id
    assert first.receipt is not None and first.receipt.cost_usd_micros > 0
    second = keeper.converse(messages=MESSAGES)
    stubber.assert_no_pending_responses()

    spend = spend_reaches(keeper, 2)
    premium = {label.label: label for label in spend.labels}["premium"]
    assert premium.requests == 2  # three deliveries, two requests
    assert premium.input_tokens == 1500 + 400 and premium.output_tokens == 800 + 100
    assert premium.cost_usd_micros == first.receipt.cost_usd_micros + second.receipt.cost_usd_micros
    assert keeper.close()


def test_prompt_cache_tokens_are_read_from_converse_and_reported(server):
    _, creds = provision(server)
    bedrock, stubber = stubbed_bedrock()
    keeper, calls = make_keeper(server, creds, bedrock_client=bedrock)
    stubber.add_response(
        "converse", converse_response(input_tokens=100, output_tokens=50, cache_read=2000, cache_write=300)
    )
    result = keeper.converse(messages=MESSAGES)
    (sent,) = calls.bodies("POST", "/usage")
    assert (sent["cache_read_input_tokens"], sent["cache_write_input_tokens"]) == (2000, 300)
    assert sent["calling_region"] == "us-east-1" and sent["request_id"] == result.usage.request_id
    assert result.receipt.status == "accepted"
    assert keeper.close()


def test_background_queue_sends_batches_of_at_most_100_and_flushes_on_close(server):
    _, creds = provision(server)
    bedrock, stubber = stubbed_bedrock()
    keeper, calls = make_keeper(server, creds, bedrock_client=bedrock, report_in_background=True)
    for _ in range(3):
        stubber.add_response("converse", converse_response(input_tokens=100, output_tokens=10))
    results = [keeper.converse(messages=MESSAGES) for _ in range(3)]
    assert all(result.receipt is None for result in results)
    for _ in range(147):
        keeper.submit_usage(usage(input_tokens=100, output_tokens=10))
    assert keeper.close()  # flushes the queue, then revokes

    batches = calls.bodies("POST", "/usage/batch")
    sizes = [len(body["requests"]) for body in batches]
    assert sum(sizes) == 150 and max(sizes) <= 100 and calls.count("POST", "/usage") == 0
    ids = [item["request_id"] for body in batches for item in body["requests"]]
    assert len(set(ids)) == 150

    checker, _ = make_keeper(server, creds)
    spend = spend_reaches(checker, 150)
    assert spend.total_requests == 150
    assert checker.close()


def test_all_quotas_spent_raises_quota_exceeded_with_retry_after(server):
    # One label with a 100 micro-USD budget; 10,000 economy input tokens cost 350.
    _, creds = provision(server, timezone="Asia/Tokyo", model_ordering=["economy"], quotas={"economy": 100})
    bedrock, stubber = stubbed_bedrock()
    keeper, _ = make_keeper(server, creds, bedrock_client=bedrock)
    keeper.report_usage(usage(label="economy", model="amazon.nova-micro-v1:0", input_tokens=10_000))

    error = wait_for_quota_exceeded(keeper)
    assert isinstance(error, QuotaExceeded), "model selection never answered 429 QUOTA_EXCEEDED"
    tokyo = ZoneInfo("Asia/Tokyo")
    next_midnight = datetime.combine(datetime.now(tokyo).date() + timedelta(days=1), datetime.min.time(), tokyo)
    assert error.retry_after == next_midnight.astimezone(UTC)
    assert error.status == 429 and error.code == "QUOTA_EXCEEDED"

    with pytest.raises(QuotaExceeded) as caught:  # Bedrock is never called: the stub has nothing queued
        keeper.converse(messages=MESSAGES)
    assert caught.value.retry_after == error.retry_after
    stubber.assert_no_pending_responses()
    assert keeper.close()
