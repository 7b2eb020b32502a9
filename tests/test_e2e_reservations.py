"""The hard cap end to end over real HTTP against the local server (``python -m local``,
aggregator on a 1 s timer): 64 concurrent clients that reserve before each call and settle
after it never spend past the quota, and leave less than one call's worst case unused;
the same with the scope's total cap binding, and with an ORG scope shared by three apps.
A crashed client (reserves, never reports) blocks nobody past its ``ttl_secs``."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import requests

from tests.local_server import module_server
from tests.tenants import new_tenant

KEY = "e2e-reservations-provisioning-key"
CLIENTS = 64
CALL = {"max_input_tokens": 1000, "max_output_tokens": 1000}
WORST = {"premium": 4000, "standard": 3080}  # 1000 in + 1000 out at config.yaml's prices

pytestmark = pytest.mark.e2e


base_url = module_server(KEY, AGGREGATOR_INTERVAL_SECONDS="1")


def provision(base_url: str, apps: list[str], **org) -> tuple[str, dict[str, dict]]:
    """A new org with ``apps``; (org id, each app's Authorization header)."""
    tenant = new_tenant(base_url, KEY, apps, **org)
    return tenant.org_id, {app: tenant.bearer(app) for app in apps}


def run_clients(base_url: str, org_id: str, headers: dict[str, dict], clients: int = CLIENTS) -> list[int]:
    """``clients`` threads (spread over the apps) that each loop: reserve, "call" (an actual
    cost of 40-100 % of the worst case), report with the reservation id. A refused client
    stops once its refusal saw nothing held (no hold left that could settle below its
    amount). The cost of every accepted record."""
    apps = list(headers)
    costs: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(number: int) -> None:
        app = apps[number % len(apps)]
        path = f"{base_url}/api/v1/orgs/{org_id}/apps/{app}"
        session = requests.Session()
        session.headers.update(headers[app])
        rng = random.Random(number)
        start.wait()
        while True:
            held = session.post(f"{path}/reservations", json=CALL, timeout=30)
            if held.status_code == 429:
                details = held.json()["details"]
                if not details["total_reserved_usd_micros"] and not any(details["reserved_usd_micros"].values()):
                    return
                time.sleep(0.05)
                continue
            assert held.status_code == 201, held.text
            hold = held.json()
            share = rng.uniform(0.4, 1.0)
            record = {
                "request_id": str(uuid.uuid4()),
                "model_label": hold["label"],
                "bedrock_model_id": hold["bedrock_model_id"],
                "input_tokens": int(CALL["max_input_tokens"] * share),
                "output_tokens": int(CALL["max_output_tokens"] * share),
                "status": "OK",
                "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "reservation_id": hold["reservation_id"],
            }
            for _ in range(2):  # a retry of the same record settles nothing twice
                reply = session.post(f"{path}/usage", json=record, timeout=30)
                assert reply.status_code == 202, reply.text
            assert reply.json()["duplicate"] is True and reply.json()["reservation"]["settled"] is False
            with lock:
                costs.append(reply.json()["processing"]["cost_usd_micros"])

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return costs


def folded_total(base_url: str, org_id: str, headers: dict, app: str, expected: int) -> dict:
    """The app's aggregates once the aggregator has folded ``expected`` micro-USD (or after 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        body = requests.get(
            f"{base_url}/api/v1/orgs/{org_id}/apps/{app}/aggregates/today", headers=headers, timeout=10
        ).json()
        if body["total_cost_usd_micros"] == expected or time.monotonic() > deadline:
            return body
        time.sleep(0.5)


def hard_capped(base_url: str, name: str, apps: list[str], cap: int, worst: int, **org) -> tuple[int, dict]:
    """``run_clients`` on a new org with ``apps``: what they spent, which must be at most
    ``cap`` and leave less than ``worst`` (one call's worst case) unused, and the first app's
    folded totals once they show it."""
    org_id, headers = provision(base_url, apps, **org)
    costs = run_clients(base_url, org_id, headers)
    spent = sum(costs)
    print(f"{name}: {len(costs)} calls, spent {spent} of {cap}")
    assert cap - worst < spent <= cap
    return spent, folded_total(base_url, org_id, headers[apps[0]], apps[0], spent)


def test_64_clients_on_one_label_never_overshoot_and_leave_less_than_one_call(base_url):
    quota = 300_000
    spent, body = hard_capped(
        base_url, "one label", ["app-1"], quota, WORST["premium"], model_ordering=["premium"], quotas={"premium": quota}
    )
    assert body["total_cost_usd_micros"] == spent
    assert body["models"]["premium"]["reserved_usd_micros"] == 0  # every hold settled


def test_64_clients_with_the_total_cap_binding(base_url):
    cap = 250_000
    quotas = {"premium": 200_000, "standard": 200_000}
    spent, body = hard_capped(
        base_url,
        "total cap",
        ["app-1"],
        cap,
        max(WORST.values()),
        model_ordering=list(quotas),
        quotas=quotas,
        total_quota_usd_micros=cap,
    )
    assert body["models"]["premium"]["cost_usd_micros"] <= 200_000  # the label quota held too
    assert body["models"]["standard"]["cost_usd_micros"] > 0  # fell back once premium was held full


def test_64_clients_of_three_apps_sharing_an_org_scope(base_url):
    quota = 300_000
    apps = ["app-a", "app-b", "app-c"]
    spent, body = hard_capped(
        base_url,
        "org scope",
        apps,
        quota,
        WORST["premium"],
        quota_scope="ORG",
        model_ordering=["premium"],
        quotas={"premium": quota},
    )
    assert body["total_cost_usd_micros"] == spent


def test_a_crashed_client_blocks_nobody_past_its_ttl(base_url):
    org_id, headers = provision(base_url, ["app-1"], model_ordering=["premium"], quotas={"premium": 5000})
    path = f"{base_url}/api/v1/orgs/{org_id}/apps/app-1/reservations"
    crashed = requests.post(path, json={**CALL, "ttl_secs": 10}, headers=headers["app-1"], timeout=10)
    assert crashed.status_code == 201, crashed.text  # ... and it never reports
    expires = datetime.fromisoformat(crashed.json()["expires_at"].replace("Z", "+00:00"))
    blocked = requests.post(path, json=CALL, headers=headers["app-1"], timeout=10)
    assert blocked.status_code == 429
    assert blocked.json()["details"]["reserved_usd_micros"] == {"premium": WORST["premium"]}
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 1.0)
    after = requests.post(path, json=CALL, headers=headers["app-1"], timeout=10)
    assert after.status_code == 201, after.text


def test_spend_reported_without_a_reservation_on_another_label_takes_room_from_the_total_cap(base_url):
    """A reservation's room under the total cap counts what the scope spent on every label,
    reserved or not. An org made now keeps config labels apart from its scope total, so the
    room adds their totals when it is read: a call on ``standard`` reported without a hold
    leaves ``premium`` less than its worst case under the cap."""
    quotas = {"premium": 200_000, "standard": 200_000}
    org_id, headers = provision(
        base_url, ["app-1"], model_ordering=list(quotas), quotas=quotas, total_quota_usd_micros=6_000
    )
    app = f"{base_url}/api/v1/orgs/{org_id}/apps/app-1"
    standard = {
        "request_id": str(uuid.uuid4()),
        "model_label": "standard",
        "bedrock_model_id": "amazon.nova-2-lite-v1:0",
        "input_tokens": 10_000,  # 3,300 micro-USD and more: 6,000 - that < premium's 4,000
        "output_tokens": 0,
        "status": "OK",
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    reply = requests.post(f"{app}/usage", json=standard, headers=headers["app-1"], timeout=10)
    assert reply.status_code == 202, reply.text
    cost = reply.json()["processing"]["cost_usd_micros"]
    assert 6_000 - cost < WORST["premium"]
    assert folded_total(base_url, org_id, headers["app-1"], "app-1", cost)["total_cost_usd_micros"] == cost
    pinned = requests.post(
        f"{app}/reservations", json={**CALL, "model_label": "premium"}, headers=headers["app-1"], timeout=10
    )
    assert pinned.status_code == 429, pinned.text
    assert pinned.json()["error"] == "QUOTA_EXCEEDED"
