"""End to end over real HTTP against the local stack (in-process server, embedded moto,
aggregator timer every second): a quota boost, usage with prompt-cache tokens, the spend
report in JSON and CSV once the aggregator folded it, and the alerts endpoint."""

from __future__ import annotations

import csv
import io
import os
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
import requests

from local.server import LocalStack
from price_keeper import state
from tests.tenants import new_tenant
from tests.usage_support import iso, usage_body

KEY = "e2e-spend-controls-key"
AGGREGATION_DEADLINE_SECONDS = 30

pytestmark = pytest.mark.e2e


def _forget_clients() -> None:
    state.reset()


@pytest.fixture
def base_url():
    """A local stack on a free port; the process environment is restored afterwards."""
    saved = dict(os.environ)
    for name in ("AWS_ENDPOINT_URL", "DYNAMODB_ENDPOINT_URL", "AWS_PROFILE"):
        os.environ.pop(name, None)
    os.environ.update(
        AGGREGATOR_INTERVAL_SECONDS="1", PRICING_REFRESH_INTERVAL_SECONDS="0", RATE_LIMITS="off", BCRYPT_ROUNDS="4"
    )
    _forget_clients()
    stack = LocalStack(port=0, provisioning_key=KEY, persist=False).start()
    try:
        yield stack.base_url
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(saved)
        _forget_clients()


def _ok(reply: requests.Response, status: int) -> dict | str:
    assert reply.status_code == status, reply.text
    return reply.json() if reply.headers.get("Content-Type", "").startswith("application/json") else reply.text


def test_boost_usage_report_and_alerts_over_http(base_url):
    tz = "America/New_York"
    quotas = {"premium": 3_000, "standard": 1_000_000}
    tenant = new_tenant(
        base_url, KEY, {"web": {"app_name": "Web"}}, timezone=tz, model_ordering=list(quotas), quotas=quotas
    )
    org_id, admin = tenant.org_id, {"X-API-Key": KEY}

    # 3,000 + 1,000 boost: the 3,280 spent below is 82 % of the boosted quota (80 % alert, no fallback)
    boost = {
        "model_label": "premium",
        "amount_usd_micros": 1_000,
        "app_id": "web",
        "expires_at": datetime.fromtimestamp(time.time() + 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    boosts_url = f"{base_url}/api/v1/orgs/{org_id}/quota-boosts"
    assert requests.post(boosts_url, json=boost, headers={"X-API-Key": "wrong"}, timeout=10).status_code == 401
    created = _ok(requests.post(boosts_url, json=boost, headers=admin, timeout=10), 201)
    assert created["amount_usd_micros"] == 1_000 and created["app_id"] == "web"

    bearer = tenant.bearer("web")
    now = datetime.now(UTC)
    cached = {"cache_read_input_tokens": 4000, "cache_write_input_tokens": 100}
    body = usage_body(input_tokens=1000, output_tokens=500, timestamp=iso(now), **cached)
    accepted = _ok(
        requests.post(f"{base_url}/api/v1/orgs/{org_id}/apps/web/usage", headers=bearer, json=body, timeout=10), 202
    )
    cost = accepted["processing"]["cost_usd_micros"]
    assert cost == 800 + 1600 + 800 + 80  # input, output, cache read, cache write at config prices

    today = now.astimezone(ZoneInfo(tz)).date().isoformat()
    report_url = f"{base_url}/api/v1/orgs/{org_id}/reports/spend"
    query = {"from": today, "to": today, "app_id": "web"}
    deadline = time.monotonic() + AGGREGATION_DEADLINE_SECONDS
    rows = []
    while not rows and time.monotonic() < deadline:  # the aggregator timer folds the shard within ~1 s
        rows = _ok(requests.get(report_url, params=query, headers=bearer, timeout=10), 200)["rows"]
        time.sleep(0.2)
    assert rows == [
        {
            "date": today,
            "app_id": "web",
            "label": "premium",
            "cost_usd_micros": cost,
            "input_tokens": 1000,
            "output_tokens": 500,
            "cache_read_input_tokens": 4000,
            "cache_write_input_tokens": 100,
            "requests": 1,
        }
    ]
    as_csv = _ok(requests.get(report_url, params={**query, "format": "csv"}, headers=bearer, timeout=10), 200)
    assert list(csv.DictReader(io.StringIO(as_csv))) == [
        {name: "" if value is None else str(value) for name, value in rows[0].items()}
    ]
    assert (
        requests.get(report_url, params={"from": today, "to": today}, headers=bearer, timeout=10).status_code == 403
    )  # an app token must name its app

    alerts_url = f"{base_url}/api/v1/orgs/{org_id}/alerts"
    org_bearer = tenant.bearer()
    listed = _ok(requests.get(alerts_url, headers=org_bearer, timeout=10), 200)
    while not listed["alerts"] and time.monotonic() < deadline:  # alerts follow the totals in the same run
        time.sleep(0.2)
        listed = _ok(requests.get(alerts_url, headers=org_bearer, timeout=10), 200)
    assert listed["date"] == today
    # 82 % of the boosted premium quota: the 80 % alert proves both the aggregator's alerting and the boost
    assert [(a["type"], a["label"], a["threshold_pct"]) for a in listed["alerts"]] == [("THRESHOLD", "premium", 80)]
    assert requests.get(alerts_url, headers=bearer, timeout=10).status_code == 403  # org token only


def test_a_quota_takes_at_most_20_active_boosts_however_they_are_sent_over_http(base_url):
    """An admin racing boosts at a quota near its limit gets no more than the limit: 18
    boosts, then 5 sent at once, of which 2 are stored and 3 refused with the limit; the
    quota model selection compares with is raised by exactly 20."""
    from concurrent.futures import ThreadPoolExecutor

    quotas = {"premium": 3_000, "standard": 1_000_000}
    tenant = new_tenant(base_url, KEY, {"web": {"app_name": "Web"}}, model_ordering=list(quotas), quotas=quotas)
    boosts_url, admin = f"{base_url}/api/v1/orgs/{tenant.org_id}/quota-boosts", {"X-API-Key": KEY}
    boost = {
        "model_label": "premium",
        "amount_usd_micros": 1,
        "app_id": "web",
        "expires_at": datetime.fromtimestamp(time.time() + 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    for _ in range(18):
        _ok(requests.post(boosts_url, json=boost, headers=admin, timeout=10), 201)
    with ThreadPoolExecutor(max_workers=5) as pool:
        replies = list(pool.map(lambda _: requests.post(boosts_url, json=boost, headers=admin, timeout=10), range(5)))
    assert sorted(reply.status_code for reply in replies) == [201, 201, 400, 400, 400]
    for refused in (reply.json() for reply in replies if reply.status_code == 400):
        assert (refused["error"], refused["details"]) == ("INVALID_REQUEST", {"limit": 20, "active": 20})
    selection = _ok(
        requests.get(
            f"{base_url}/api/v1/orgs/{tenant.org_id}/apps/web/model-selection",
            params={"force_check": "true"},
            headers=tenant.bearer("web"),
            timeout=10,
        ),
        200,
    )
    assert selection["quota_status"]["models_status"]["premium"]["quota_usd_micros"] == 3_000 + 20
