"""End to end over real HTTP against ``python -m local``, which counts by the ledger:
reports, retries and a void reach today's aggregates through the usage stream's images,
each record counted once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.local_server import local_server
from tests.tenants import new_tenant
from tests.usage_support import iso, usage_body

KEY = "e2e-ledger-provisioning-key"
DEADLINE_SECONDS = 30

pytestmark = pytest.mark.e2e


def eventually(check, what: str):
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)
    return found


def test_reports_retries_and_a_void_reach_the_aggregates_once_each(tmp_path):
    with local_server(tmp_path, KEY) as url:
        tenant = new_tenant(url, KEY, ["web"], model_ordering=["premium", "standard"])
        app, headers = tenant.app_path("web"), tenant.bearer("web")
        bodies = [usage_body(model_label=label) for label in ("premium", "premium", "standard")]
        replies = [requests.post(f"{app}/usage", json=body, headers=headers, timeout=10) for body in bodies]
        retried = requests.post(f"{app}/usage", json=bodies[0], headers=headers, timeout=10)
        # the same request id again under another label and an earlier time: still the first record
        disguised = {**bodies[0], "model_label": "standard", "bedrock_model_id": bodies[2]["bedrock_model_id"]}
        disguised["timestamp"] = iso(datetime.now(UTC) - timedelta(minutes=3))
        relabelled = requests.post(f"{app}/usage", json=disguised, headers=headers, timeout=10)
        assert relabelled.status_code == 202 and relabelled.json()["duplicate"] is True, relabelled.text
        assert relabelled.json()["daily_total"]["label"] == "premium"  # answered with what was counted
        batch = requests.post(
            f"{app}/usage/batch",
            json={"requests": [bodies[1], usage_body(model_label="standard")]},
            headers=headers,
            timeout=10,
        )
        assert [reply.status_code for reply in replies] == [202, 202, 202] and retried.json()["duplicate"] is True
        assert [result["duplicate"] for result in batch.json()["results"]] == [True, False]
        cost = {"premium": 0, "standard": batch.json()["results"][1]["cost_usd_micros"]}
        for body, reply in zip(bodies, replies, strict=True):
            cost[body["model_label"]] += reply.json()["processing"]["cost_usd_micros"]

        def today() -> dict:
            reply = requests.get(f"{app}/aggregates/today", headers=headers, timeout=10)
            assert reply.status_code == 200, reply.text
            models = reply.json()["models"]
            return {label: (models[label]["cost_usd_micros"], models[label]["requests"]) for label in cost}

        wanted = {"premium": (cost["premium"], 2), "standard": (cost["standard"], 2)}
        eventually(lambda: today() == wanted, f"all four: {wanted} {today()}")
        voided = requests.post(
            f"{tenant.org_path}/usage/void",
            headers={"X-API-Key": KEY},
            json={"app_id": "web", "request_ids": [bodies[2]["request_id"]], "reason": "reported in error"},
            timeout=10,
        )
        assert voided.status_code == 200 and voided.json()["voided"] == 1, voided.text
        left = cost["standard"] - replies[2].json()["processing"]["cost_usd_micros"]
        eventually(lambda: today()["standard"] == (left, 1), "the void folded")
        assert today()["premium"] == (cost["premium"], 2)


def test_near_its_quota_a_label_shows_each_report_before_its_fold_and_counts_it_once(tmp_path):
    """The ledger's totals lag the fold by a second or two; in tight mode a report also goes
    on the label-day's live item, so a selection made right after it (well inside the
    stream's 1 s batching window) already sees it, and once folded it is counted once, not
    on the item and the total both."""
    with local_server(tmp_path, KEY) as url:
        tenant = new_tenant(
            url,
            KEY,
            ["web"],
            model_ordering=["premium", "standard"],
            quotas={"premium": 10_000, "standard": 10**9},
            overrides={"tight_mode_threshold_pct": 50},
        )
        app, headers = tenant.app_path("web"), tenant.bearer("web")

        def premium_spend() -> int:
            reply = requests.get(f"{app}/model-selection", headers=headers, timeout=10)
            assert reply.status_code == 200, reply.text
            return reply.json()["quota_status"]["models_status"]["premium"]["spend_usd_micros"]

        costs = []
        for _ in range(2):  # 75 % of the quota: tight once folded
            reply = requests.post(f"{app}/usage", json=usage_body(model_label="premium"), headers=headers, timeout=10)
            costs.append(reply.json()["processing"]["cost_usd_micros"])
        eventually(lambda: premium_spend() == sum(costs), "the first two folded")
        reply = requests.post(f"{app}/usage", json=usage_body(model_label="premium"), headers=headers, timeout=10)
        assert reply.status_code == 202, reply.text
        costs.append(reply.json()["processing"]["cost_usd_micros"])
        assert premium_spend() == sum(costs)  # before its fold: on the live item
        time.sleep(3)  # folded now (the stream's window is 1 s): taken back off the live item
        assert premium_spend() == sum(costs)
        today = requests.get(f"{app}/aggregates/today", headers=headers, timeout=10).json()["models"]["premium"]
        assert (today["cost_usd_micros"], today["requests"]) == (sum(costs), 3)
