"""End to end over real HTTP: the local server (``python -m local``) in a subprocess with
the aggregator on a 1 s timer. Provision an org and an app, spend past the first label's
quota, see the fallback, stay on it (sticky) even when the label would be available again,
exhaust every label and get 429 with ``retry_after`` and ``Retry-After``."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
import requests

from price_keeper.config import get_config
from tests.local_server import local_server
from tests.tenants import new_tenant
from tests.usage_support import output_chunks

KEY = "e2e-quota-provisioning-key"
AGGREGATION_WAIT_SECONDS = 30

pytestmark = pytest.mark.e2e


@pytest.fixture
def base_url(tmp_path):
    with local_server(tmp_path, KEY, AGGREGATOR_INTERVAL_SECONDS="1") as url:
        yield url


QUOTAS = {"premium": 1_000_000, "standard": 1_000_000, "economy": 1_000_000}  # 1 USD a day each


class Client:
    def __init__(self, base_url: str):
        self.base_url = base_url
        self.app_id = "checkout"
        self.headers: dict = {}

    def provision(self) -> None:
        tenant = new_tenant(
            self.base_url,
            KEY,
            {self.app_id: {"app_name": "Checkout", "quotas": QUOTAS}},
            timezone="Asia/Kolkata",
            quotas=QUOTAS,
        )
        self.org_id, self.app_path = tenant.org_id, tenant.app_path(self.app_id)
        self.headers = tenant.bearer(self.app_id)

    def put_app(self, quotas: dict) -> requests.Response:
        reply = requests.put(
            self.app_path, headers={"X-API-Key": KEY}, timeout=10, json={"app_name": "Checkout", "quotas": quotas}
        )
        assert reply.status_code == 200, reply.text
        return reply

    def report(self, label: str, output_tokens: int, **params) -> dict:
        """One usage record of ``output_tokens`` of ``label`` over HTTP: its 202 body."""
        reply = requests.post(
            f"{self.app_path}/usage",
            headers=self.headers,
            params=params,
            timeout=10,
            json={
                "request_id": str(uuid.uuid4()),
                "model_label": label,
                "bedrock_model_id": get_config().labels[label].id,
                "input_tokens": 0,
                "output_tokens": output_tokens,
                "status": "OK",
                "timestamp": (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        )
        assert reply.status_code == 202, reply.text
        return reply.json()

    def spend(self, label: str, output_tokens: int) -> int:
        """Report ``output_tokens`` in records within the per-record cap; their total cost."""
        return sum(self.report(label, chunk)["processing"]["cost_usd_micros"] for chunk in output_chunks(output_tokens))

    def report_asking_for_the_selection(self, label: str) -> dict | None:
        """A report of a call that cost nothing, asking for the selection with it
        (``?model_selection=true``): the selection its 202 carries."""
        return self.report(label, 0, model_selection="true")["model_selection"]

    def selection(self) -> requests.Response:
        return requests.get(
            f"{self.app_path}/model-selection", headers=self.headers, params={"force_check": "true"}, timeout=10
        )

    def wait_for_selection(self, done) -> requests.Response:
        """Poll model selection until ``done(reply)`` (the aggregator folds usage every second)."""
        deadline = time.monotonic() + AGGREGATION_WAIT_SECONDS
        while True:
            reply = self.selection()
            if done(reply):
                return reply
            assert time.monotonic() < deadline, f"selection never changed: {reply.status_code} {reply.text}"
            time.sleep(0.5)


def recommends(label: str):
    return lambda reply: reply.status_code == 200 and reply.json()["recommended_model"]["label"] == label


def test_fallback_sticky_and_exhaustion_over_http(base_url):
    client = Client(base_url)
    client.provision()
    first = client.selection()
    assert first.status_code == 200, first.text
    assert (first.json()["recommended_model"]["label"], first.json()["recommended_model"]["reason"]) == (
        "premium",
        "NORMAL",
    )
    assert first.headers["Cache-Control"] == "max-age=300, private"

    assert client.spend("premium", 400_000) == 1_280_000  # 1.28 USD of a 1 USD quota

    fallback = client.wait_for_selection(recommends("standard")).json()
    assert fallback["recommended_model"]["reason"] == "QUOTA_EXCEEDED_PREMIUM"
    assert fallback["quota_status"]["sticky_fallback_active"] is True
    carried = client.report_asking_for_the_selection("standard")  # a report learns the same
    assert carried["recommended_model"] == fallback["recommended_model"]
    assert carried["quota_status"]["sticky_fallback_active"] is True
    assert fallback["quota_status"]["models_status"]["premium"]["status"] == "EXCEEDED"
    aggregates = requests.get(f"{client.app_path}/aggregates/today", headers=client.headers, timeout=10).json()
    assert (aggregates["current_active_model"], aggregates["sticky_fallback_active"]) == ("standard", True)
    assert aggregates["models"]["premium"]["cost_usd_micros"] == 1_280_000

    client.put_app({**QUOTAS, "premium": 100_000_000})  # premium would be available again...
    sticky = client.selection().json()
    assert (sticky["recommended_model"]["label"], sticky["recommended_model"]["reason"]) == (
        "standard",
        "STICKY_FALLBACK",
    )
    client.put_app(QUOTAS)  # ...and is spent again

    client.spend("standard", 400_000)  # 1.10 USD
    client.wait_for_selection(recommends("economy"))
    client.spend("economy", 8_000_000)  # 1.12 USD
    # 429 as soon as economy's first records are folded; wait until the aggregator has all of them
    exhausted = client.wait_for_selection(
        lambda reply: reply.status_code == 429 and reply.json()["details"]["models"]["economy"]["quota_pct"] >= 112.0
    )
    body = exhausted.json()
    assert body["error"] == "QUOTA_EXCEEDED" and body["message"] == "All model quotas exceeded for today"
    assert client.report_asking_for_the_selection("economy") is None  # every label spent
    retry_at = datetime.fromisoformat(body["retry_after"].replace("Z", "+00:00"))
    assert retry_at.astimezone(timezone(timedelta(hours=5, minutes=30))).strftime("%H:%M:%S") == "00:00:00"
    seconds = int(exhausted.headers["Retry-After"])
    assert abs((datetime.now(UTC) + timedelta(seconds=seconds)) - retry_at) < timedelta(seconds=10)
    assert body["details"]["models"] == {
        "premium": {"quota_pct": 128.0, "exceeded": True},
        "standard": {"quota_pct": 110.0, "exceeded": True},
        "economy": {"quota_pct": 112.0, "exceeded": True},
    }
    assert body["details"]["total_overage_usd_micros"] == 280_000 + 100_000 + 120_000


def test_a_report_cannot_ask_for_another_apps_selection_nor_count_with_a_bad_ask_over_http(base_url):
    """The selection a report carries is guarded as the selection endpoint is: another org's
    app token gets 403 and no selection; a ``model_selection`` that is not a boolean is a 400
    in the error schema and counts nothing (the same ``request_id`` is new afterwards)."""
    client, intruder = Client(base_url), Client(base_url)
    client.provision()
    intruder.provision()
    record = {
        "request_id": str(uuid.uuid4()),
        "model_label": "premium",
        "bedrock_model_id": get_config().labels["premium"].id,
        "input_tokens": 10,
        "output_tokens": 1,
        "status": "OK",
        "timestamp": (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    url = f"{client.app_path}/usage"
    stolen = requests.post(url, headers=intruder.headers, params={"model_selection": "true"}, json=record, timeout=10)
    assert stolen.status_code == 403 and stolen.json()["error"] == "FORBIDDEN"
    assert "model_selection" not in stolen.json()
    bad = requests.post(url, headers=client.headers, params={"model_selection": "maybe"}, json=record, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"] == "INVALID_REQUEST"
    first = requests.post(url, headers=client.headers, params={"model_selection": "true"}, json=record, timeout=10)
    assert first.status_code == 202 and first.json()["duplicate"] is False  # neither attempt above counted it
    assert first.json()["model_selection"]["org_id"] == client.org_id
