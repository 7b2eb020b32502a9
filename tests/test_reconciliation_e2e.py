"""Reconciliation over real HTTP: the local server (``python -m local``) in a subprocess, its
Bedrock stand-in answering Converse and recording Bedrock's metrics in the local
CloudWatch, the reconciler on its timer (every second, with a 5 s tolerance), and
``GET /api/v1/reconciliation``. An app that makes 3 calls and reports 1 shows 2 calls'
tokens unmetered and its org gets ``UNREPORTED_USAGE``; an app that reports everything
through ``PriceKeeper.converse`` / ``converse_stream`` shows none."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import boto3
import pytest
import requests

from price_keeper_client import PriceKeeper
from tests.client.conftest import Server, cli, wait_for
from tests.local_server import reconciling_server
from tests.tenants import Tenant, new_tenant
from tests.usage_support import iso, usage_body

KEY = "reconciliation-provisioning-key"
ADMIN = {"X-API-Key": KEY}
MICRO = "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-micro-v1:0"
LITE = "amazon.nova-2-lite-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "How much did this cost? " * 10}]}]  # 240 characters: 60 tokens
SETTLE_SECONDS = 60  # how long the tests wait for the reconciler (it runs every second)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("reconciliation")


@pytest.fixture(scope="module")
def base_url(folder):
    with reconciling_server(folder, KEY) as url:
        yield url


def aws(service: str, base_url: str):
    return boto3.client(
        service,
        region_name="us-east-1",
        endpoint_url=base_url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def provision(base_url: str, label: str) -> Tenant:
    """A new org (UTC) with one app "web" whose only label is ``label``."""
    return new_tenant(base_url, KEY, {"web": {"app_name": "W"}}, model_ordering=[label], quotas={label: 50_000_000})


def reconciled(base_url: str, model_id: str, invocations: int) -> dict | None:
    """Today's row of ``model_id`` once Bedrock's side counts ``invocations`` calls."""
    today = datetime.now(UTC).date().isoformat()
    reply = requests.get(f"{base_url}/api/v1/reconciliation", params={"date": today}, headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text
    assert (reply.json()["date"], reply.json()["region"]) == (today, "us-east-1")
    row = next((row for row in reply.json()["models"] if row["model_id"] == model_id), None)
    return row if row and row["bedrock"]["invocations"] >= invocations else None


def test_an_app_that_reports_one_call_of_three_shows_two_unmetered_and_its_org_is_alerted(base_url, folder):
    tenant = provision(base_url, "economy")
    profile = aws("bedrock", base_url).create_inference_profile(
        inferenceProfileName=f"web-{uuid.uuid4().hex[:8]}", modelSource={"copyFrom": MICRO}
    )["inferenceProfileArn"]
    app, path = tenant.bearer("web"), tenant.app_path("web")
    registered = requests.post(
        f"{path}/inference-profiles",
        headers=app,
        timeout=10,
        json={"profile_label": "micro", "inference_profile_arn": profile},
    )
    assert registered.status_code == 201, registered.text
    runtime = aws("bedrock-runtime", base_url)
    usages = [
        runtime.converse(modelId=profile, messages=MESSAGES, inferenceConfig={"maxTokens": 40})["usage"]
        for _ in range(3)
    ]
    assert usages == [{"inputTokens": 60, "outputTokens": 40, "totalTokens": 100}] * 3
    record = {"model_label": "micro", "bedrock_model_id": profile, "calling_region": "us-east-1"}
    body = usage_body(**record, input_tokens=60, output_tokens=40, timestamp=iso(datetime.now(UTC)))
    reported = requests.post(f"{path}/usage", headers=app, timeout=10, json=body)
    assert reported.status_code == 202, reported.text
    profile_id = profile.rsplit("/", 1)[1]
    row = wait_for(lambda: reconciled(base_url, profile_id, 3), timeout=SETTLE_SECONDS)
    assert row == {
        "model_id": profile_id,
        "bedrock": {"invocations": 3, "input_tokens": 180, "output_tokens": 120},
        "metered": {"invocations": 1, "input_tokens": 60, "output_tokens": 40},
        # 120 input x 0.035 + 80 output x 0.14 USD per 1M tokens (config.yaml economy), rounded up
        "unmetered": {"input_tokens": 120, "output_tokens": 80, "estimated_cost_usd_micros": 16},
    }

    def unreported_alerts():
        found = requests.get(f"{tenant.org_path}/alerts", headers=tenant.bearer())
        assert found.status_code == 200, found.text
        return [alert for alert in found.json()["alerts"] if alert["type"] == "UNREPORTED_USAGE"]

    (alert,) = wait_for(unreported_alerts, timeout=SETTLE_SECONDS)
    assert (alert["model_id"], alert["app_id"]) == (profile_id, "web")
    (log,) = folder.glob("server-*.log")  # the event, as the server logs each one it publishes
    assert [line for line in log.read_text().splitlines() if "UNREPORTED_USAGE" in line and profile_id in line]


def test_an_app_that_reports_everything_through_price_keeper_shows_nothing_unmetered(base_url, folder):
    tenant = provision(base_url, "standard")
    credentials = tenant.credentials["web"]
    keeper = PriceKeeper(
        base_url,
        credentials["client_id"],
        credentials["client_secret"],
        bedrock_client=aws("bedrock-runtime", base_url),
    )
    answer = keeper.converse(messages=MESSAGES, inferenceConfig={"maxTokens": 40})
    assert answer.response["output"]["message"]["content"][0]["text"]
    assert answer.receipt.cost_usd_micros == 130  # 60 x 0.33 + 40 x 2.75 USD per 1M tokens (config.yaml standard)
    stream = keeper.converse_stream(messages=MESSAGES, inferenceConfig={"maxTokens": 40})
    events = list(stream)
    assert events[-1]["metadata"]["usage"] == {"inputTokens": 60, "outputTokens": 40, "totalTokens": 100}
    assert stream.receipt.cost_usd_micros == 130
    keeper.converse(messages=MESSAGES, inferenceConfig={"maxTokens": 40})
    assert keeper.close()
    row = wait_for(lambda: reconciled(base_url, LITE, 3), timeout=SETTLE_SECONDS)
    assert row["bedrock"] == row["metered"] == {"invocations": 3, "input_tokens": 180, "output_tokens": 120}
    assert row["unmetered"] == {"input_tokens": 0, "output_tokens": 0, "estimated_cost_usd_micros": 0}
    alerts = requests.get(f"{tenant.org_path}/alerts", headers=tenant.bearer())
    assert alerts.json()["alerts"] == []
    # nor an operator-level one (the bus's alerts are also logged by the server)
    (log,) = folder.glob("server-*.log")
    assert not [line for line in log.read_text().splitlines() if "UNREPORTED_USAGE" in line and LITE in line]


def test_the_reconciliation_needs_the_provisioning_key_and_a_valid_date(base_url):
    assert requests.get(f"{base_url}/api/v1/reconciliation", timeout=10).status_code == 401
    bad = requests.get(f"{base_url}/api/v1/reconciliation", params={"date": "2026-13-01"}, headers=ADMIN, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"] == "INVALID_REQUEST"
    empty = requests.get(f"{base_url}/api/v1/reconciliation", params={"date": "2020-01-01"}, headers=ADMIN, timeout=10)
    assert empty.json() == {"date": "2020-01-01", "region": "us-east-1", "models": [], "page": 0, "pages": 0}
    for page in ("-1", "x", "1"):  # not a page number; past the last
        past = requests.get(
            f"{base_url}/api/v1/reconciliation", params={"date": "2020-01-01", "page": page}, headers=ADMIN, timeout=10
        )
        assert past.status_code == 400 and past.json()["error"] == "INVALID_REQUEST", (page, past.text)


def test_the_cli_shows_the_days_reconciliation(base_url, tmp_path):
    today = datetime.now(UTC).date().isoformat()
    server, admin = Server(base_url, KEY, tmp_path / "unused.log"), {"PRICE_KEEPER_API_KEY": KEY}
    aws("bedrock-runtime", base_url).converse(modelId="amazon.titan-text-lite-v1", messages=MESSAGES)
    wait_for(lambda: reconciled(base_url, "amazon.titan-text-lite-v1", 1), timeout=SETTLE_SECONDS)
    shown = cli(server, "reconciliation", today, "--json", env=admin)
    assert shown.returncode == 0, shown.stderr
    served = requests.get(f"{base_url}/api/v1/reconciliation", params={"date": today}, headers=ADMIN, timeout=10)
    assert json.loads(shown.stdout) == served.json()
    table = cli(server, "reconciliation", env=admin)
    assert table.returncode == 0, table.stderr
    assert "amazon.titan-text-lite-v1: 1 calls, 0 metered · unmetered 60 in / 100 out tokens" in table.stdout
    assert cli(server, "reconciliation", "yesterday", env=admin).returncode == 2
    assert cli(server, "reconciliation", env={"PRICE_KEEPER_API_KEY": "wrong"}).returncode == 3
