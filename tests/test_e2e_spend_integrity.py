"""End to end over real HTTP against ``python -m local`` (aggregator on a 1 s timer): the
spend-integrity holes of the second outside review, each as a user or an attacker of
the quota would meet it (docs/security.md)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.local_server import eventually, local_server
from tests.tenants import new_tenant
from tests.usage_support import iso, usage_body, zone_away_from_midnight

KEY = "e2e-spend-integrity-provisioning-key"
QUOTAS = {"premium": 1_000_000, "standard": 1_000_000, "economy": 1_000_000}
PREMIUM_COST = 3760  # 1,500 input and 800 output tokens of premium (config.yaml)

pytestmark = pytest.mark.e2e


LOGS: list = []  # the server's log folder (its audit lines)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    logs = tmp_path_factory.mktemp("spend-integrity")
    LOGS.append(logs)
    with local_server(logs, KEY, AGGREGATOR_INTERVAL_SECONDS="1") as url:
        yield url


def record(label: str = "premium", **fields) -> dict:
    return usage_body(**{"model_label": label, **fields})


class Org:
    """An org (in a timezone far from midnight now) and its ``apps``, created over HTTP."""

    def __init__(self, base_url: str, apps: dict | tuple = ("web",), quota_scope: str = "APP", **fields):
        self.admin = {"X-API-Key": KEY}
        org = {"timezone": zone_away_from_midnight(), "model_ordering": list(QUOTAS), "quotas": QUOTAS, **fields}
        self.tenant = new_tenant(base_url, KEY, apps, quota_scope=quota_scope, **org)
        self.path = self.tenant.org_path

    def app(self, app_id: str) -> App:
        return App(self, app_id, self.tenant.bearer(app_id))

    def boost(self, label: str, amount: int, app_id: str | None = None) -> None:
        body = {
            "model_label": label,
            "amount_usd_micros": amount,
            "expires_at": iso(datetime.now(UTC) + timedelta(hours=2)),
        }
        reply = requests.post(
            f"{self.path}/quota-boosts",
            headers=self.admin,
            json={**body, **({"app_id": app_id} if app_id else {})},
            timeout=10,
        )
        assert reply.status_code == 201, reply.text


class App:
    def __init__(self, org: Org, app_id: str, bearer: dict):
        self.org, self.app_id, self.bearer = org, app_id, bearer

    @property
    def path(self) -> str:
        return f"{self.org.path}/apps/{self.app_id}"

    def usage(self, **fields) -> requests.Response:
        return requests.post(f"{self.path}/usage", json=record(**fields), headers=self.bearer, timeout=10)

    def batch(self, records: list[dict]) -> requests.Response:
        return requests.post(f"{self.path}/usage/batch", json={"requests": records}, headers=self.bearer, timeout=10)

    def selection(self) -> requests.Response:
        return requests.get(
            f"{self.path}/model-selection", params={"force_check": "true"}, headers=self.bearer, timeout=10
        )

    def recommended(self) -> tuple[str | None, str | None]:
        reply = self.selection()
        if reply.status_code != 200:
            return None, reply.json()["error"]
        return reply.json()["recommended_model"]["label"], reply.json()["recommended_model"]["reason"]

    def today(self) -> dict:
        reply = requests.get(f"{self.path}/aggregates/today", headers=self.bearer, timeout=10)
        assert reply.status_code == 200, reply.text
        return reply.json()


# --- item 11: a batch's daily_totals show today's boosts ------------------------------------


def test_a_batch_reply_compares_spend_with_the_boosted_quota_as_usage_and_selection_do(base_url):
    org = Org(base_url)
    web = org.app("web")
    org.boost("premium", 500_000, app_id="web")
    single = web.usage()
    assert single.status_code == 202, single.text
    assert single.json()["daily_total"]["quota_usd_micros"] == 1_500_000
    batch = web.batch([record()])
    assert batch.status_code == 207, batch.text
    (premium,) = batch.json()["daily_totals"]
    assert premium["quota_usd_micros"] == 1_500_000
    selected = web.selection().json()["quota_status"]["models_status"]["premium"]
    assert selected["quota_usd_micros"] == 1_500_000


# --- item 4: usage replies carry the scope's total against its cap --------------------------


def test_usage_replies_carry_the_scope_total_and_its_cap(base_url):
    org = Org(base_url, total_quota_usd_micros=10_000, overrides={"tight_mode_threshold_pct": 50})
    web = org.app("web")
    first = web.usage()  # 3,760 of 10,000
    assert first.status_code == 202, first.text
    eventually(lambda: web.today()["total_cost_usd_micros"] == PREMIUM_COST, "the first record folded")
    reply = web.usage(model_label="standard")  # a label of its own: its daily_total knows nothing of premium
    body = reply.json()
    assert body["daily_total"]["status"] == "NORMAL"
    assert body["scope_total"] == {
        "org_day": body["daily_total"]["org_day"],
        "spend_usd_micros": PREMIUM_COST,
        "quota_usd_micros": 10_000,
        "quota_pct": 37.6,
        "status": "NORMAL",
    }
    standard_cost = body["processing"]["cost_usd_micros"]
    eventually(lambda: web.today()["total_cost_usd_micros"] == PREMIUM_COST + standard_cost, "the second record folded")
    batch = web.batch([record("economy")]).json()
    spent = PREMIUM_COST + standard_cost
    assert batch["scope_total"]["spend_usd_micros"] == spent and batch["scope_total"]["status"] == "TIGHT"
    assert [entry["status"] for entry in batch["daily_totals"]] == ["NORMAL"]


# --- item 5: ORG scope, apps with different orderings share one sticky state -----------------


def spend_past(app: App, label: str, quota: int) -> None:
    """Report records on ``label`` until its spend passes ``quota`` (one batch)."""
    cost = app.usage(model_label=label).json()["processing"]["cost_usd_micros"]
    reply = app.batch([record(label) for _ in range(quota // cost)])
    assert reply.status_code == 207 and reply.json()["failed"] == 0, reply.text


def test_an_app_is_never_sticky_past_a_label_its_own_ordering_has_not_spent(base_url):
    quotas = {"premium": 100_000, "standard": 10_000, "economy": 1_000_000}
    orderings = {"h1": ["premium", "standard", "economy"], "h2": ["standard", "economy"]}
    apps = {app_id: {"model_ordering": ordering} for app_id, ordering in orderings.items()}
    org = Org(base_url, apps, quota_scope="ORG", quotas=quotas)
    h1, h2 = org.app("h1"), org.app("h2")
    assert h1.recommended() == ("premium", "NORMAL")
    spend_past(h2, "standard", quotas["standard"])  # the org's standard is spent, premium untouched
    assert eventually(lambda: h2.recommended() == ("economy", "QUOTA_EXCEEDED_STANDARD"), "h2 falls back")
    assert h1.recommended() == ("premium", "NORMAL")  # was: economy, STICKY_FALLBACK, premium at 0 %
    assert h1.selection().json()["quota_status"]["sticky_fallback_active"] is False
    assert h1.today()["current_active_model"] == "premium"
    spend_past(h1, "premium", quotas["premium"])  # now h1's own first label is spent too
    assert eventually(lambda: h1.recommended() == ("economy", "QUOTA_EXCEEDED_STANDARD"), "h1 falls back")


# --- item 7: one app of an ORG scope draining its siblings ------------------------------------


def test_an_apps_daily_cap_stops_it_and_leaves_its_org_scope_siblings_their_quota(base_url):
    apps = {"greedy": {"app_daily_cap_usd_micros": 10_000}, "meek": {}}  # greedy's own cap, lower
    org = Org(base_url, apps, quota_scope="ORG", app_daily_cap_usd_micros=500_000)  # the default of every app
    greedy, meek = org.app("greedy"), org.app("meek")
    spend_past(greedy, "premium", 10_000)  # 11,280 of the org's 1,000,000 premium
    refused = eventually(
        lambda: [r.json()] if (r := greedy.selection()).status_code == 429 else None, "greedy's cap is reached"
    )[0]
    assert refused["error"] == "QUOTA_EXCEEDED" and refused["message"] == "Daily app quota exceeded for today"
    assert refused["details"]["app_total"] == {
        "spend_usd_micros": 3 * PREMIUM_COST,
        "quota_usd_micros": 10_000,
        "quota_pct": 112.8,
        "exceeded": True,
        "reserved_usd_micros": 0,
    }
    assert meek.recommended() == ("premium", "NORMAL")
    body = meek.selection().json()["quota_status"]
    assert body["models_status"]["premium"]["spend_usd_micros"] == 3 * PREMIUM_COST  # one org-wide premium
    assert body["app_total"] == {
        "spend_usd_micros": 0,
        "quota_usd_micros": 500_000,
        "quota_pct": 0.0,
        "exceeded": False,
        "reserved_usd_micros": 0,
    }
    assert greedy.usage().status_code == 202  # a call made is still counted


def test_an_app_that_reserves_instead_of_selecting_is_held_to_its_daily_cap(base_url):
    """A hard-capped client never asks for a selection; its reservations alone must stop
    it at its own cap in an ORG scope, whatever the org's quota has left, and leave its
    sibling the rest (red-team: reserving alone took an app to 225 % of its cap)."""
    apps = {"greedy": {"app_daily_cap_usd_micros": 10_000}, "meek": {}}
    org = Org(base_url, apps, quota_scope="ORG")
    greedy, meek = org.app("greedy"), org.app("meek")
    call = {"model_label": "premium", "max_input_tokens": 1000, "max_output_tokens": 1000}  # 4,000 worst case

    def reserve(app: App) -> requests.Response:
        return requests.post(f"{app.path}/reservations", json=call, headers=app.bearer, timeout=10)

    assert [reserve(greedy).status_code for _ in range(4)] == [201, 201, 429, 429]  # 8,000 held; 12,000 > 10,000
    assert reserve(meek).status_code == 201


def void(org: Org, request_ids: list[str], key: str = KEY) -> requests.Response:
    body = {"app_id": "web", "request_ids": request_ids, "reason": "reported twice by a client bug"}
    return requests.post(f"{org.path}/usage/void", headers={"X-API-Key": key}, json=body, timeout=10)


def test_an_operator_voids_usage_reported_in_error_exactly_once_and_every_view_follows(base_url):
    org = Org(base_url)
    web = org.app("web")
    assert web.usage().status_code == 202
    wrong = [record() for _ in range(2)]
    assert web.batch(wrong).json()["accepted"] == 2
    eventually(lambda: web.today()["total_cost_usd_micros"] == 3 * PREMIUM_COST, "three records folded")
    ids = [item["request_id"] for item in wrong]
    unknown = str(uuid.uuid4())
    assert void(org, ids, key="not-the-key").status_code == 401

    reply = void(org, [*ids, unknown])
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["voided"], body["voided_cost_usd_micros"]) == (2, 2 * PREMIUM_COST)
    assert [(r["request_id"], r["status"]) for r in body["results"]] == [
        (ids[0], "voided"),
        (ids[1], "voided"),
        (unknown, "not_found"),
    ]
    premium = eventually(
        lambda: (m := web.today()["models"]["premium"])["cost_usd_micros"] == PREMIUM_COST and m, "the voids folded"
    )
    assert premium["requests"] == 1 and premium["input_tokens"] == 1500

    again = void(org, ids).json()  # idempotent: nothing more is taken back
    assert (again["voided"], [r["status"] for r in again["results"]]) == (0, ["already_voided"] * 2)
    assert web.batch(wrong).json()["results"][0]["duplicate"] is True  # a resent voided record stays out
    assert web.usage().status_code == 202
    today = eventually(lambda: (t := web.today())["total_cost_usd_micros"] == 2 * PREMIUM_COST and t, "folded")
    assert today["models"]["premium"]["requests"] == 2
    report = requests.get(
        f"{org.path}/reports/spend",
        params={"from": today["date"], "to": today["date"], "app_id": "web"},
        headers=web.bearer,
        timeout=10,
    ).json()
    assert [(row["label"], row["cost_usd_micros"], row["requests"]) for row in report["rows"]] == [
        ("premium", 2 * PREMIUM_COST, 2)
    ]
    (log,) = LOGS[0].glob("server-*.log")
    audited = [line for line in log.read_text().splitlines() if 'action="usage.void"' in line]
    assert len(audited) == 3 and 'outcome="refused"' in audited[0] and "authenticated=false" in audited[0]
    assert f'voided=["{ids[0]}", "{ids[1]}"]' in audited[1] and "voided=[]" in audited[2]
