"""Seconds-fresh spend over real HTTP: with the aggregator's schedule set to an hour, each
usage report reaches today's aggregates through the usage table's stream (the local server
polls it and hands batches to the aggregator function, as the event source mapping does).
Speed is measured in ``benchmarks/freshness.py``; here the deadline only bounds a hang."""

from __future__ import annotations

import time

import pytest
import requests

from tests.local_server import local_server
from tests.tenants import bearer, new_tenant
from tests.usage_support import usage_body, zone_away_from_midnight

KEY = "e2e-freshness-provisioning-key"
DEADLINE_SECONDS = 30
QUOTAS = {"premium": 10**9, "standard": 10**9}

pytestmark = pytest.mark.e2e


def provision(base: str) -> tuple[str, dict]:
    """(app URL, app credentials) of a new org and app, in a timezone whose day does not end
    during the test (run across midnight, a restart's reports fell on another day)."""
    tenant = new_tenant(
        base, KEY, ["fresh"], model_ordering=["premium", "standard"], quotas=QUOTAS, timezone=zone_away_from_midnight()
    )
    return tenant.app_path("fresh"), tenant.credentials["fresh"]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(app URL, bearer headers) on a server whose sweep runs once an hour."""
    with local_server(tmp_path_factory.mktemp("freshness"), KEY, AGGREGATOR_INTERVAL_SECONDS="3600") as base:
        app_url, credentials = provision(base)
        yield app_url, bearer(base, credentials)


def wait_for_requests(app_url: str, headers: dict, wanted: int) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while requests_today(app_url, headers) < wanted:
        assert time.monotonic() < deadline, f"the aggregates never showed {wanted} requests"
        time.sleep(0.1)


def label_requests(app_url: str, headers: dict) -> dict[str, int]:
    reply = requests.get(f"{app_url}/aggregates/today", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return {label: model["requests"] for label, model in reply.json()["models"].items()}


def requests_today(app_url: str, headers: dict) -> int:
    return sum(label_requests(app_url, headers).values())


def test_each_usage_report_reaches_todays_aggregates_without_the_schedule(app):
    app_url, headers = app
    for reported in (1, 2, 3):
        label = ("premium", "standard", "premium")[reported - 1]
        reply = requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=usage_body(model_label=label))
        assert reply.status_code == 202, reply.text
        wait_for_requests(app_url, headers, reported)
    assert requests_today(app_url, headers) == 3


def test_a_batch_of_reports_reaches_the_scope_total(app):
    app_url, headers = app
    before = requests_today(app_url, headers)
    body = {"requests": [usage_body(model_label=label) for label in ("premium", "standard") * 5]}
    reply = requests.post(f"{app_url}/usage/batch", headers=headers, timeout=10, json=body)
    assert reply.status_code == 207 and reply.json()["accepted"] == 10, reply.text
    assert {total["label"] for total in reply.json()["daily_totals"]} == {"premium", "standard"}
    wait_for_requests(app_url, headers, before + 10)
    selection = requests.get(f"{app_url}/model-selection", headers=headers, timeout=10).json()
    assert selection["quota_status"]["total"]["spend_usd_micros"] > 0


def test_after_a_restart_the_replayed_stream_counts_nothing_twice(tmp_path):
    """The journal replays every write, so the restarted server's stream holds them all again;
    folding them again changes nothing, and new usage adds to what was there."""
    settings = {
        "LOCAL_PERSIST": "on",
        "LOCAL_STATE_DIR": str(tmp_path / "state"),
        "AGGREGATOR_INTERVAL_SECONDS": "3600",
    }
    with local_server(tmp_path, KEY, **settings) as base:
        app_url, credentials = provision(base)
        headers = bearer(base, credentials)
        for _ in range(2):
            assert requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=usage_body()).status_code == 202
        wait_for_requests(app_url, headers, 2)
    journal = (tmp_path / "state" / "moto-journal.jsonl").read_text()
    assert "DynamoDBStreams" not in journal and "GetItem" not in journal  # writes only
    app_path = app_url.removeprefix(base)
    with local_server(tmp_path, KEY, **settings) as base:
        app_url, headers = base + app_path, bearer(base, credentials)
        assert requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=usage_body()).status_code == 202
        wait_for_requests(app_url, headers, 3)  # the stream holds the replayed writes before this one
        assert requests_today(app_url, headers) == 3


def test_reports_after_a_duplicate_still_reach_the_aggregates(app):
    """A duplicate cancels its transaction; the stream keeps flowing after it."""
    app_url, headers = app
    before = label_requests(app_url, headers)
    body = usage_body()
    for _ in range(2):
        assert requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=body).status_code == 202
    later = usage_body(model_label="standard")
    assert requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=later).status_code == 202
    deadline = time.monotonic() + DEADLINE_SECONDS
    while (after := label_requests(app_url, headers))["standard"] == before["standard"]:
        assert time.monotonic() < deadline, "the report after the duplicate never reached the aggregates"
        time.sleep(0.1)
    # Folded after the duplicate, the later report shows the duplicate counted once.
    assert after == {"premium": before["premium"] + 1, "standard": before["standard"] + 1}
