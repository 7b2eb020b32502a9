"""End to end over real HTTP, as an attacker of the quota would try it: an app token and the
provisioning key against ``python -m local`` (aggregator on a 1 s timer). Each test is one
way around the promise "spend stays inside the quota and every call counts once" that
used to work, and now does not (docs/metering.md "Integrity rules", docs/security.md)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests

from price_keeper.timeutil import day_start_utc, org_date
from tests.local_server import eventually, module_server
from tests.tenants import ORG, new_tenant
from tests.usage_support import PREMIUM_DOLLAR, iso, usage_body, zone_away_from_midnight

KEY = "e2e-integrity-provisioning-key"
QUOTAS = {"premium": 1_000_000, "standard": 5_000_000, "economy": 5_000_000}  # premium: $1 a day
LOCAL_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-2-lite-v1:0"

pytestmark = pytest.mark.e2e


base_url = module_server(KEY, AGGREGATOR_INTERVAL_SECONDS="1")


class Tenant:
    """An org (in a timezone far from midnight now) and its app "web", over HTTP."""

    def __init__(self, base_url: str, quota_scope: str = "APP", **org_fields):
        self.zone = zone_away_from_midnight()
        self.org_fields = {
            "timezone": self.zone,
            "quota_scope": quota_scope,
            "model_ordering": list(QUOTAS),
            "quotas": QUOTAS,
            **org_fields,
        }
        tenant = new_tenant(base_url, KEY, {"web": {"app_name": "Web"}}, **self.org_fields)
        self.org_id, self.org_path, self.app_path = tenant.org_id, tenant.org_path, tenant.app_path("web")
        self.bearer = tenant.bearer("web")

    def put_org(self, **changes) -> requests.Response:
        body = {**ORG, **self.org_fields, **changes}
        return requests.put(self.org_path, headers={"X-API-Key": KEY}, json=body, timeout=10)

    def usage(self, request_id: str | None = None, **fields) -> requests.Response:
        body = usage_body(request_id, **{"input_tokens": 1000, "output_tokens": 500, **fields})
        return requests.post(f"{self.app_path}/usage", json=body, headers=self.bearer, timeout=10)

    def batch(self, records: list[dict]) -> requests.Response:
        return requests.post(
            f"{self.app_path}/usage/batch", json={"requests": records}, headers=self.bearer, timeout=10
        )

    def selection(self) -> requests.Response:
        return requests.get(
            f"{self.app_path}/model-selection", params={"force_check": "true"}, headers=self.bearer, timeout=10
        )

    def today(self) -> dict:
        reply = requests.get(f"{self.app_path}/aggregates/today", headers=self.bearer, timeout=10)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def yesterday_noon(self) -> str:
        return iso(day_start_utc(self.zone, org_date(self.zone) - timedelta(days=1)) + timedelta(hours=12))


def recommended(tenant: Tenant) -> str | None:
    reply = tenant.selection()
    return reply.json()["recommended_model"]["label"] if reply.status_code == 200 else None


def test_backdated_spend_stops_todays_premium(base_url):
    tenant = Tenant(base_url)
    assert recommended(tenant) == "premium"
    reply = tenant.usage(timestamp=tenant.yesterday_noon(), **PREMIUM_DOLLAR)  # $1.00, stamped yesterday
    assert reply.status_code == 202, reply.text
    assert reply.json()["daily_total"]["org_day"] == org_date(tenant.zone).strftime("%Y%m%d")
    assert eventually(lambda: recommended(tenant) == "standard", "premium spent by a backdated record")
    assert tenant.today()["models"]["premium"]["cost_usd_micros"] == 1_000_000


def test_a_timezone_change_does_not_bring_a_spent_premium_back(base_url):
    tenant = Tenant(base_url)
    assert tenant.usage(**PREMIUM_DOLLAR).status_code == 202
    eventually(lambda: recommended(tenant) == "standard", "premium spent")
    # the zone whose "today" is another date than the org's: a fresh day, were it allowed
    other = next(
        zone for zone in ("Pacific/Kiritimati", "Pacific/Pago_Pago") if org_date(zone) != org_date(tenant.zone)
    )
    reply = tenant.put_org(timezone=other)
    assert reply.status_code == 409, reply.text
    body = reply.json()
    assert body["error"] == "CONFLICT" and body["details"]["changed"] == ["timezone"]
    assert body["details"]["timezone"] == tenant.zone and body["details"]["next_org_midnight"].endswith("Z")
    assert recommended(tenant) == "standard"
    assert tenant.today()["timezone"] == tenant.zone


def test_a_request_id_stays_a_duplicate_and_the_scope_stays_while_the_day_has_spend(base_url):
    tenant = Tenant(base_url)
    request_id = str(uuid.uuid4())
    first = tenant.usage(request_id)
    assert first.status_code == 202 and first.json()["duplicate"] is False
    reply = tenant.put_org(quota_scope="ORG")
    assert reply.status_code == 409 and reply.json()["details"]["changed"] == ["quota_scope"], reply.text
    again = tenant.usage(request_id)
    assert again.status_code == 202 and again.json()["duplicate"] is True
    assert again.json()["processing"]["cost_usd_micros"] == first.json()["processing"]["cost_usd_micros"]


def test_spend_on_a_self_registered_profile_shows_and_the_total_cap_stops_selection(base_url):
    tenant = Tenant(base_url, total_quota_usd_micros=1_000)  # $0.001 a day over every label
    registered = requests.post(
        f"{tenant.app_path}/inference-profiles",
        headers=tenant.bearer,
        timeout=10,
        json={"profile_label": "my-lite", "inference_profile_arn": LOCAL_PROFILE},
    )
    assert registered.status_code == 201, registered.text
    assert recommended(tenant) == "premium"
    spent = tenant.usage(model_label="my-lite", bedrock_model_id=LOCAL_PROFILE, calling_region="us-east-1")
    assert spent.status_code == 202, spent.text
    cost = spent.json()["processing"]["cost_usd_micros"]
    assert cost > 1_000  # past the cap, on a label that is in no ordering
    refused = eventually(
        lambda: [r.json()] if (r := tenant.selection()).status_code == 429 else None, "the total cap is reached"
    )  # (a 429 Response is falsy: wrap its body)
    body = refused[0]
    assert body["error"] == "QUOTA_EXCEEDED" and body["message"] == "Daily total quota exceeded for today"
    assert body["details"]["total"] == {
        "spend_usd_micros": cost,
        "quota_usd_micros": 1_000,
        "quota_pct": body["details"]["total"]["quota_pct"],
        "exceeded": True,
        "reserved_usd_micros": 0,
    }
    today = tenant.today()
    assert today["models"]["my-lite"]["cost_usd_micros"] == cost and today["total_cost_usd_micros"] == cost


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_edge_of_calendar_timestamps_are_400_and_a_batch_isolates_them(base_url, stamp):
    tenant = Tenant(base_url)
    reply = tenant.usage(timestamp=stamp)
    assert reply.status_code == 400 and reply.json()["error"] == "INVALID_REQUEST", reply.text
    good = [usage_body(model_label="standard", input_tokens=10, output_tokens=10) for _ in range(3)]
    bad = {**good[0], "request_id": str(uuid.uuid4()), "timestamp": stamp}
    batch = tenant.batch([good[0], bad, good[1], good[2]])
    assert batch.status_code == 207, batch.text
    assert [r["status"] for r in batch.json()["results"]] == ["accepted", "failed", "accepted", "accepted"]
    again = tenant.batch(good)  # every good record was written, exactly once
    assert [r["duplicate"] for r in again.json()["results"]] == [True, True, True]
    assert eventually(lambda: tenant.today()["models"]["standard"]["requests"] == 3, "three records counted")


def test_a_batch_cannot_count_a_request_id_twice(base_url):
    """A batch's records share transactions: a client repeating a request id inside one
    batch, resending ids counted before beside new ones, or sending the same batch twice at
    once still has each id counted once, over HTTP."""
    tenant = Tenant(base_url)
    a, b, c, d, e = [usage_body(model_label="standard", input_tokens=10, output_tokens=10) for _ in range(5)]
    assert [r["duplicate"] for r in tenant.batch([a]).json()["results"]] == [False]
    mixed = tenant.batch([a, b, b, c, a])
    assert mixed.status_code == 207, mixed.text
    assert [(r["status"], r["duplicate"]) for r in mixed.json()["results"]] == [
        ("accepted", True),
        ("accepted", False),
        ("accepted", True),
        ("accepted", False),
        ("accepted", True),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        replies = list(pool.map(lambda _: tenant.batch([d, e]).json()["results"], range(2)))
    counted = [r["request_id"] for results in replies for r in results if not r["duplicate"]]
    assert sorted(counted) == sorted([d["request_id"], e["request_id"]])  # each once, whichever batch won
    assert eventually(lambda: tenant.today()["models"]["standard"]["requests"] == 5, "five ids counted once each")


def test_one_record_cannot_spend_a_day(base_url):
    tenant = Tenant(base_url)
    reply = tenant.usage(output_tokens=10**10)
    assert reply.status_code == 400, reply.text
    assert reply.json()["details"] == {
        "field": "output_tokens",
        "limit": 128_000,
        "value": 10**10,
        "model_label": "premium",
    }
