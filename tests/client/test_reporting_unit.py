"""Usage reporting rules that the local server cannot be made to trigger on demand
(5xx, rate limits, per-item failures), checked against the HTTP exchanges with ``responses``."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
import requests
import responses

from price_keeper_client import InvalidRequest, PriceKeeper, RetryPolicy, ServiceUnavailable, UsageRecord

URL = "http://keeper.test"
ORG = str(uuid.uuid4())
APP = "app-1"
USAGE = f"{URL}/api/v1/orgs/{ORG}/apps/{APP}/usage"


def record(**fields) -> UsageRecord:
    return UsageRecord(
        **{
            "request_id": str(uuid.uuid4()),
            "model_label": "premium",
            "bedrock_model_id": "amazon.nova-pro-v1:0",
            "input_tokens": 10,
            "output_tokens": 5,
            "timestamp": datetime.now(UTC),
            **fields,
        }
    )


@pytest.fixture
def http():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.post(
            f"{URL}/auth/token",
            json={
                "access_token": "a1",
                "refresh_token": "r1",
                "token_type": "Bearer",
                "expires_in": 3600,
                "refresh_expires_in": 604800,
            },
        )
        mock.post(f"{URL}/auth/revoke", status=204)
        yield mock


def keeper(sleeps: list, **kwargs) -> PriceKeeper:
    retry = RetryPolicy(attempts=4, base_delay=0.5, max_delay=4, sleep=sleeps.append, jitter=lambda low, high: high)
    return PriceKeeper(URL, f"org-{ORG}-app-{APP}", "secret", retry=retry, **kwargs)


def accepted(request_id: str) -> dict:
    return {"request_id": request_id, "status": "accepted", "processing": {"shard_id": 1, "cost_usd_micros": 24}}


def accepted_batch(request_id: str, **fields) -> dict:
    """A usage batch's 207 answer accepting its one record (``fields``: the rest of the answer)."""
    result = {"request_id": request_id, "status": "accepted", "shard_id": 2}
    return {"accepted": 1, "failed": 0, "results": [result], **fields}


def usage_bodies(http) -> list[dict]:
    return [json.loads(call.request.body) for call in http.calls if call.request.url == USAGE]


def test_transient_failures_are_retried_with_the_same_request_id_and_growing_backoff(http):
    sleeps: list[float] = []
    item = record()
    http.post(USAGE, status=503, json={"error": "SERVICE_UNAVAILABLE", "message": "busy", "timestamp": "x"})
    http.post(USAGE, body=requests.ConnectionError("reset"))
    http.post(USAGE, status=500, json={"error": "INTERNAL_ERROR", "message": "oops", "timestamp": "x"})
    http.post(USAGE, status=202, json=accepted(item.request_id))
    receipt = keeper(sleeps).report_usage(item)
    assert receipt.cost_usd_micros == 24
    assert [body["request_id"] for body in usage_bodies(http)] == [item.request_id] * 4
    assert sleeps == [0.5, 1.0, 2.0]  # jitter pinned to its upper bound: base * 2^(n-1)


def test_backoff_is_capped_and_jittered():
    policy = RetryPolicy(base_delay=1, max_delay=5, jitter=lambda low, high: (low, high))
    assert [policy.backoff(n) for n in (1, 2, 3, 4, 5)] == [(0, 1), (0, 2), (0, 4), (0, 5), (0, 5)]


def test_rate_limit_honours_retry_after(http):
    sleeps: list[float] = []
    item = record()
    http.post(
        USAGE,
        status=429,
        headers={"Retry-After": "7"},
        json={"error": "RATE_LIMIT_EXCEEDED", "message": "slow down", "retry_after": 7, "timestamp": "x"},
    )
    http.post(USAGE, status=202, json=accepted(item.request_id))
    keeper(sleeps).report_usage(item)
    assert sleeps == [7.0]


def test_client_errors_are_not_retried(http):
    sleeps: list[float] = []
    http.post(USAGE, status=400, json={"error": "INVALID_REQUEST", "message": "bad timestamp", "timestamp": "x"})
    with pytest.raises(InvalidRequest):
        keeper(sleeps).report_usage(record())
    assert len(usage_bodies(http)) == 1 and sleeps == []


def test_gives_up_after_the_last_attempt(http):
    sleeps: list[float] = []
    for _ in range(4):
        http.post(USAGE, status=503, json={"error": "SERVICE_UNAVAILABLE", "message": "busy", "timestamp": "x"})
    with pytest.raises(ServiceUnavailable):
        keeper(sleeps).report_usage(record())
    assert len(usage_bodies(http)) == 4 and len(sleeps) == 3


def test_record_usage_queues_what_the_service_cannot_take_now(http):
    """A report that still fails after retries goes to the background queue, which delivers it later."""
    sleeps: list[float] = []
    item = record()
    for _ in range(4):
        http.post(USAGE, body=requests.ConnectionError("down"))
    http.post(f"{USAGE}/batch", status=207, json=accepted_batch(item.request_id))
    client = keeper(sleeps)
    assert client.record_usage(item) is None
    assert client.flush(timeout=10)
    batch = [json.loads(c.request.body) for c in http.calls if c.request.url == f"{USAGE}/batch"]
    assert batch == [{"requests": [item.to_json()]}]
    assert client.close()


def test_background_batches_resend_items_failed_transiently_and_keep_refused_ones(http):
    sleeps: list[float] = []
    ok, busy, bad = (record() for _ in range(3))
    busy_failures = [1]  # the service is busy for this record once

    def answer(request):
        results = []
        for item in json.loads(request.body)["requests"]:
            if item["request_id"] == bad.request_id:
                results.append({"request_id": bad.request_id, "status": "failed", "error": "INVALID_MODEL_LABEL"})
            elif item["request_id"] == busy.request_id and busy_failures:
                busy_failures.pop()
                results.append({"request_id": busy.request_id, "status": "failed", "error": "SERVICE_UNAVAILABLE"})
            else:
                results.append({"request_id": item["request_id"], "status": "accepted", "shard_id": 0})
        accepted = sum(result["status"] == "accepted" for result in results)
        return 207, {}, json.dumps({"accepted": accepted, "failed": len(results) - accepted, "results": results})

    http.add_callback(responses.POST, f"{USAGE}/batch", callback=answer)
    client = keeper(sleeps, report_in_background=True)
    for item in (ok, busy, bad):
        client.record_usage(item)
    assert client.flush(timeout=10)
    sent = [
        r["request_id"]
        for c in http.calls
        if c.request.url == f"{USAGE}/batch"
        for r in json.loads(c.request.body)["requests"]
    ]
    assert sorted(sent) == sorted([ok.request_id, busy.request_id, bad.request_id, busy.request_id])
    assert client.reporter.rejected == [(bad, "INVALID_MODEL_LABEL")]
    assert client.reporter.undelivered == [] and len(sleeps) == 1
    assert client.close()


def test_usage_record_sends_prompt_cache_tokens_only_when_present():
    plain = record().to_json()
    assert "cache_read_input_tokens" not in plain and "calling_region" not in plain
    cached = record(cache_read_input_tokens=100, cache_write_input_tokens=7, calling_region="eu-west-1").to_json()
    assert (cached["cache_read_input_tokens"], cached["cache_write_input_tokens"], cached["calling_region"]) == (
        100,
        7,
        "eu-west-1",
    )
    assert plain["timestamp"].endswith("Z") and "." not in plain["timestamp"]


SELECTION = f"{URL}/api/v1/orgs/{ORG}/apps/{APP}/model-selection"


def selection_answer(label: str, mode: str = "NORMAL") -> dict:
    return {
        "recommended_model": {"label": label, "bedrock_model_id": f"{label}-id", "reason": "NORMAL"},
        "quota_status": {"mode": mode, "quota_pct": 50.0},
        "client_guidance": {"check_frequency": "PERIODIC_300S", "cache_duration_secs": 300},
    }


def spent(label: str) -> dict:
    return {"label": label, "quota_pct": 100.1, "status": "EXCEEDED", "mode": "TIGHT"}


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_usage_answer_saying_the_label_is_spent_makes_the_next_call_select_again(http, batch):
    """The cached choice would hold for 300 s; the usage answer says premium is spent, so the
    very next call asks the service, which moves to standard."""
    http.get(SELECTION, json=selection_answer("premium"), headers={"Cache-Control": "max-age=300, private"})
    http.get(SELECTION, json=selection_answer("standard"), headers={"Cache-Control": "max-age=300, private"})
    item = record()
    if batch:
        http.post(f"{USAGE}/batch", status=207, json=accepted_batch(item.request_id, daily_totals=[spent("premium")]))
    else:
        http.post(USAGE, status=202, json={**accepted(item.request_id), "daily_total": spent("premium")})
    client = keeper([])
    assert client.select_model().label == "premium"
    assert client.select_model().label == "premium"  # cached
    if batch:
        client.report_usage_batch([item])
    else:
        client.report_usage(item)
    assert client.select_model().label == "standard"
    assert sum(call.request.url.startswith(SELECTION) for call in http.calls) == 2


def test_background_batches_feed_the_selection_too(http):
    http.get(SELECTION, json=selection_answer("premium"))
    http.get(SELECTION, json=selection_answer("premium", mode="TIGHT"))
    item = record()
    tight = {"label": "premium", "quota_pct": 96.0, "status": "TIGHT", "mode": "TIGHT"}
    http.post(f"{USAGE}/batch", status=207, json=accepted_batch(item.request_id, daily_totals=[tight]))
    client = keeper([], report_in_background=True)
    assert client.select_model().mode == "NORMAL"
    client.record_usage(item)
    assert client.flush(10)
    assert client.select_model().mode == "TIGHT"
