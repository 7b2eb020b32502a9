"""Seconds-fresh spend over real HTTP: with the aggregator's schedule set to an hour, each
usage report reaches today's aggregates through the usage table's stream (the local server
polls it and hands batches to the aggregator function, as the event source mapping does).
Speed is measured in ``benchmarks/freshness.py``; here the deadline only bounds a hang."""
from __future__ import annotations

import time
import uuid

import pytest
import requests

from tests.local_server import local_server
from tests.usage_support import usage_body

KEY = "e2e-freshness-provisioning-key"
DEADLINE_SECONDS = 60

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(app URL, bearer headers) on a server whose sweep runs once an hour."""
    with local_server(tmp_path_factory.mktemp("freshness"), KEY, AGGREGATOR_INTERVAL_SECONDS="3600") as base:
        org_id, app_id = str(uuid.uuid4()), "fresh"
        reply = requests.put(f"{base}/api/v1/orgs/{org_id}", headers={"X-API-Key": KEY}, timeout=10, json={
            "org_name": "fresh", "timezone": "UTC", "quota_scope": "APP",
            "model_ordering": ["premium", "standard"], "quotas": {"premium": 10**9, "standard": 10**9}})
        assert reply.status_code == 201, reply.text
        reply = requests.put(f"{base}/api/v1/orgs/{org_id}/apps/{app_id}", headers={"X-API-Key": KEY}, timeout=10,
                             json={"app_name": "fresh"})
        assert reply.status_code == 201, reply.text
        tokens = requests.post(f"{base}/auth/token", timeout=10,
                               json={**reply.json()["credentials"], "grant_type": "client_credentials"}).json()
        yield f"{base}/api/v1/orgs/{org_id}/apps/{app_id}", {"Authorization": f"Bearer {tokens['access_token']}"}


def requests_today(app_url: str, headers: dict) -> int:
    reply = requests.get(f"{app_url}/aggregates/today", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return sum(model["requests"] for model in reply.json()["models"].values())


def test_each_usage_report_reaches_todays_aggregates_without_the_schedule(app):
    app_url, headers = app
    for reported in (1, 2, 3):
        label = ("premium", "standard", "premium")[reported - 1]
        reply = requests.post(f"{app_url}/usage", headers=headers, timeout=10, json=usage_body(model_label=label))
        assert reply.status_code == 202, reply.text
        deadline = time.monotonic() + DEADLINE_SECONDS
        while requests_today(app_url, headers) < reported:
            assert time.monotonic() < deadline, f"report {reported} never reached the aggregates"
            time.sleep(0.1)
    assert requests_today(app_url, headers) == 3


def test_a_batch_of_reports_reaches_the_scope_total(app):
    app_url, headers = app
    before = requests_today(app_url, headers)
    body = {"requests": [usage_body(model_label=label) for label in ("premium", "standard") * 5]}
    reply = requests.post(f"{app_url}/usage/batch", headers=headers, timeout=10, json=body)
    assert reply.status_code == 207 and reply.json()["accepted"] == 10, reply.text
    deadline = time.monotonic() + DEADLINE_SECONDS
    while requests_today(app_url, headers) < before + 10:
        assert time.monotonic() < deadline, "the batch never reached the aggregates"
        time.sleep(0.1)
    selection = requests.get(f"{app_url}/model-selection", headers=headers, timeout=10).json()
    assert selection["quota_status"]["total"]["spend_usd_micros"] > 0
