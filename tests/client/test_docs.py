"""The "Use it from your application" and "Operate it" sections (docs/client.md and the
README carry the same text) run as written against the local server, Bedrock stubbed."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import uuid
from datetime import UTC, datetime

import boto3
import pytest
import requests

from price_keeper_client import PriceKeeper, QuotaExceeded, UsageRecord
from price_keeper_client.models import DailySpend
from price_keeper_client.spend_table import render

from .conftest import (
    BIN,
    ROOT,
    WireStream,
    answer_converse_stream,
    converse_response,
    provision,
    stream_events,
    stubbed_bedrock,
    wait_for,
    wait_for_quota_exceeded,
)

pytestmark = pytest.mark.e2e

DOCS = ["docs/client.md", "README.md"]
DOC_ORG_ID = "550e8400-e29b-41d4-a716-446655440000"
DOC_URL = "http://127.0.0.1:8080"
DOC_API_KEY = "provisioning-key"


def section(doc: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of level 1 or 2 (outside code blocks)."""
    path = ROOT / doc
    assert path.exists(), f"{doc} is missing"
    lines, inside, in_code = [], False, False
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,2} ", line):
            if inside:
                break
            inside = line.strip() == f"## {heading}"
            continue
        if inside:
            lines.append(line)
    assert inside, f'{doc} has no "## {heading}" section (copy it from docs/client.md)'
    return "".join(lines)


def code_block(doc: str, heading: str, language: str, index: int = 0) -> str:
    blocks = re.findall(rf"^```{language}\n(.*?)^```", section(doc, heading), re.S | re.M)
    assert len(blocks) > index, f'no {language} block #{index + 1} under "## {heading}" in {doc}'
    return blocks[index]


@pytest.fixture
def bedrock_from_boto3(monkeypatch):
    """Makes ``boto3.client("bedrock-runtime")`` (what the client builds by default) the stubbed client."""
    bedrock, stubber = stubbed_bedrock()

    def client(service_name, *args, **kwargs):
        assert service_name == "bedrock-runtime"
        return bedrock

    monkeypatch.setattr(boto3, "client", client)
    return stubber


def use_credentials(monkeypatch, server, creds) -> None:
    monkeypatch.setenv("PRICE_KEEPER_URL", server.url)
    monkeypatch.setenv("PRICE_KEEPER_CLIENT_ID", creds.client_id)
    monkeypatch.setenv("PRICE_KEEPER_CLIENT_SECRET", creds.client_secret)


@pytest.mark.parametrize("doc", DOCS)
def test_application_snippet_guards_a_bedrock_call(doc, server, monkeypatch, capsys, bedrock_from_boto3):
    snippet = code_block(doc, "Use it from your application", "python")
    _, creds = provision(server)
    use_credentials(monkeypatch, server, creds)
    bedrock_from_boto3.add_response(
        "converse",
        converse_response("Three tickets, all resolved."),
        expected_params={
            "modelId": "amazon.nova-pro-v1:0",
            "messages": [{"role": "user", "content": [{"text": "Summarise today's tickets"}]}],
            "inferenceConfig": {"maxTokens": 512},
        },
    )
    exec(compile(snippet, f"{doc} snippet", "exec"), {"__name__": "snippet"})
    out = capsys.readouterr().out
    assert "Three tickets, all resolved." in out and "answered by premium (1500+800 tokens)" in out
    bedrock_from_boto3.assert_no_pending_responses()

    keeper = PriceKeeper(server.url, creds.client_id, creds.client_secret)
    spend = wait_for(lambda: (lambda s: s if s.total_requests else None)(keeper.daily_spend()))
    assert spend and spend.total_requests == 1
    assert keeper.close()


@pytest.mark.parametrize("doc", DOCS)
def test_application_snippet_when_the_budget_is_spent(doc, server, monkeypatch, capsys, bedrock_from_boto3):
    snippet = code_block(doc, "Use it from your application", "python")
    _, creds = provision(server, model_ordering=["economy"], quotas={"economy": 100})
    with PriceKeeper(server.url, creds.client_id, creds.client_secret) as keeper:
        keeper.report_usage(
            UsageRecord(str(uuid.uuid4()), "economy", "amazon.nova-micro-v1:0", 10_000, 0, datetime.now(UTC))
        )

        error = wait_for_quota_exceeded(keeper)
    assert isinstance(error, QuotaExceeded)
    use_credentials(monkeypatch, server, creds)
    exec(compile(snippet, f"{doc} snippet", "exec"), {"__name__": "snippet"})
    out = capsys.readouterr().out
    assert f"Today's Bedrock budget is spent; it resets at {error.retry_after:%Y-%m-%d %H:%M} UTC" in out
    bedrock_from_boto3.assert_no_pending_responses()  # nothing was queued, and Bedrock was not called


@pytest.mark.parametrize("doc", DOCS)
def test_streaming_snippet_relays_the_text_and_reports_the_usage(doc, server, monkeypatch, capsys):
    snippet = code_block(doc, "Use it from your application", "python", 1)
    _, creds = provision(server)
    use_credentials(monkeypatch, server, creds)
    bedrock = boto3.client(
        "bedrock-runtime", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    sent = answer_converse_stream(bedrock, WireStream(stream_events("Shipped: the new console.", 1500, 800)))
    monkeypatch.setattr(boto3, "client", lambda service_name, *args, **kwargs: bedrock)
    exec(compile(snippet, f"{doc} streaming snippet", "exec"), {"__name__": "snippet"})
    out = capsys.readouterr().out
    assert out == "Shipped: the new console.\n800 tokens, 3760 micro-USD\n"
    assert [request["modelId"] for request in sent] == ["amazon.nova-pro-v1:0"]


@pytest.mark.parametrize("doc", DOCS)
def test_operator_walk_through_runs_as_written(doc, server, tmp_path):
    script = code_block(doc, "Operate it", "bash")
    org_id = str(uuid.uuid4())  # a fresh org per run; the rest is the documented text
    script = (
        script.replace(DOC_ORG_ID, org_id)
        .replace(DOC_URL, server.url)
        .replace(f"PRICE_KEEPER_API_KEY={DOC_API_KEY}", f"PRICE_KEEPER_API_KEY={server.api_key}")
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("PRICE_KEEPER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert f"Created org {org_id}." in out and f"Created app chatbot (org {org_id})." in out
    assert "Spend on " in out and re.search(r"^premium\s+\$0\.00\s+\$10\.00\s+\[\.{20}\]", out, re.M)
    assert '"labels": [' in out and "Rotated credentials of" in out
    secret_file = tmp_path / "chatbot.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    rotated_secret = secret_file.read_text().strip()
    assert rotated_secret not in out + run.stderr
    login = requests.post(
        f"{server.url}/auth/token",
        timeout=10,
        json={
            "client_id": f"org-{org_id}-app-chatbot",
            "client_secret": rotated_secret,
            "grant_type": "client_credentials",
        },
    )
    assert login.status_code == 200


def test_spend_table_example_in_the_docs_is_what_the_cli_prints():
    example = re.search(r"`spend` prints:\n\n```\n(.*?)```", (ROOT / "docs/client.md").read_text(), re.S).group(1)
    spec_example = {  # the aggregates example of api_spec.md, for the documented org and app
        "org_id": DOC_ORG_ID,
        "app_id": "chatbot",
        "date": "2026-01-23",
        "timezone": "Europe/Paris",
        "models": {
            "premium": {
                "cost_usd_micros": 9_500_000,
                "quota_usd_micros": 10_000_000,
                "quota_pct": 95.0,
                "quota_status": "TIGHT",
                "requests": 342,
            },
            "standard": {
                "cost_usd_micros": 1_200_000,
                "quota_usd_micros": 5_000_000,
                "quota_pct": 24.0,
                "quota_status": "NORMAL",
                "requests": 89,
            },
            "economy": {
                "cost_usd_micros": 0,
                "quota_usd_micros": 2_000_000,
                "quota_pct": 0.0,
                "quota_status": "NORMAL",
                "requests": 0,
            },
        },
        "total_cost_usd_micros": 10_700_000,
        "total_quota_usd_micros": 17_000_000,
        "total_quota_pct": 62.9,
        "sticky_fallback_active": False,
        "current_active_model": "premium",
    }
    assert render(DailySpend.from_json(spec_example)) + "\n" == example
