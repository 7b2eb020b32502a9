"""The ``price-keeper`` console script end to end against the local server."""

from __future__ import annotations

import json
import re
import stat
import uuid
from datetime import UTC, datetime

import pytest
import requests

from price_keeper_client import PriceKeeper, UsageRecord

from .conftest import ORG_DEFAULTS, cli, converse_response, stubbed_bedrock, wait_for

pytestmark = pytest.mark.e2e

ORG_YAML = """\
org_id: {org_id}
org_name: Acme Corp
timezone: Europe/Paris
quota_scope: APP
model_ordering: [premium, standard, economy]
quotas:
  premium: 10000000    # $10.00 a day
  standard: 5000000
  economy: 2000000
overrides:
  tight_mode_threshold_pct: 90
"""

APP_YAML = """\
org_id: {org_id}
app_id: chatbot
app_name: Support chatbot
model_ordering: [premium, economy]
"""


def can_log_in(server, client_id: str, secret: str) -> bool:
    reply = requests.post(
        f"{server.url}/auth/token",
        timeout=10,
        json={"client_id": client_id, "client_secret": secret, "grant_type": "client_credentials"},
    )
    assert reply.status_code in (200, 401), reply.text
    return reply.status_code == 200


def test_operator_walk_through(server, tmp_path):
    admin = {"PRICE_KEEPER_API_KEY": server.api_key}
    org_id = str(uuid.uuid4())
    org_file, app_file = tmp_path / "org.yaml", tmp_path / "app.yaml"
    org_file.write_text(ORG_YAML.format(org_id=org_id))
    app_file.write_text(APP_YAML.format(org_id=org_id))

    # Create the org: the secret is printed once, with a warning on stderr.
    created = cli(server, "org", "apply", str(org_file), env=admin)
    assert created.returncode == 0, created.stderr
    org_secret = re.search(r"client_secret: (\S+)", created.stdout).group(1)
    assert f"client_id:     org-{org_id}" in created.stdout
    assert "shown only once" in created.stderr
    assert can_log_in(server, f"org-{org_id}", org_secret)

    # Applying again is idempotent: an update, and no new secret.
    again = cli(server, "org", "apply", str(org_file), env=admin)
    assert again.returncode == 0, again.stderr
    assert "updated" in again.stdout and "client_secret" not in again.stdout
    assert can_log_in(server, f"org-{org_id}", org_secret)

    # Create the app with --secret-file: the secret goes to the file only.
    secret_file = tmp_path / "chatbot.secret"
    app = cli(server, "app", "apply", str(app_file), "--secret-file", str(secret_file), "--json", env=admin)
    assert app.returncode == 0, app.stderr
    app_secret = secret_file.read_text().strip()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert app_secret not in app.stdout + app.stderr
    app_result = json.loads(app.stdout)
    client_id = app_result["client_id"]
    assert client_id == f"org-{org_id}-app-chatbot" and app_result["status"] == "created"

    # The application spends through the client library (Bedrock stubbed).
    bedrock, stubber = stubbed_bedrock()
    stubber.add_response(
        "converse",
        converse_response(input_tokens=1500, output_tokens=800),
        expected_params={
            "modelId": "amazon.nova-pro-v1:0",
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        },
    )
    with PriceKeeper(server.url, client_id, app_secret, bedrock_client=bedrock) as keeper:
        result = keeper.converse(messages=[{"role": "user", "content": [{"text": "hi"}]}])
    cost = result.receipt.cost_usd_micros

    # spend --json for scripts, once the aggregator has folded the request in.
    runtime = {"PRICE_KEEPER_CLIENT_ID": client_id, "PRICE_KEEPER_CLIENT_SECRET": app_secret}

    def folded():
        run = cli(server, "spend", "today", "--org", org_id, "--app", "chatbot", "--json", env=runtime)
        assert run.returncode == 0, run.stderr
        data = json.loads(run.stdout)
        return data if data["total_requests"] >= 1 else None

    data = wait_for(folded)
    assert data, "spend never showed the request"
    premium = {label["label"]: label for label in data["labels"]}["premium"]
    assert (premium["requests"], premium["cost_usd_micros"]) == (1, cost)
    assert data["mode"] == "NORMAL" and data["current_active_model"] in ("premium", None)
    assert {"premium", "economy"} <= {label["label"] for label in data["labels"]}

    # The table: one row per label with a bar, the mode and the active model.
    table = cli(server, "spend", "today", "--org", org_id, "--app", "chatbot", env=runtime)
    assert table.returncode == 0, table.stderr
    assert "Mode NORMAL" in table.stdout and "Europe/Paris" in table.stdout
    rows = {
        line.split()[0]: line for line in table.stdout.splitlines() if line.split()[:1] in (["premium"], ["economy"])
    }
    assert set(rows) == {"premium", "economy"}  # one row per label
    assert re.search(r"\[[#.]{20}\]", rows["premium"]) and " 1 " in rows["premium"]
    assert re.search(r"\$10\.00\b", rows["premium"])

    # Rotate with a grace period: both secrets work during it.
    rotated = cli(
        server, "app", "rotate", "--org", org_id, "--app", "chatbot", "--grace-hours", "1", "--json", env=admin
    )
    assert rotated.returncode == 0, rotated.stderr
    second_secret = json.loads(rotated.stdout)["client_secret"]
    assert json.loads(rotated.stdout)["rotation"]["grace_period_hours"] == 1
    assert can_log_in(server, client_id, app_secret) and can_log_in(server, client_id, second_secret)

    # Rotate with no grace: the previous secret stops at once.
    final_file = tmp_path / "chatbot.secret.new"
    rotated = cli(
        server,
        "org",
        "rotate",
        "--org",
        org_id,
        "--app",
        "chatbot",
        "--grace-hours",
        "0",
        "--secret-file",
        str(final_file),
        env=admin,
    )
    assert rotated.returncode == 0, rotated.stderr
    assert "no longer works" in rotated.stdout
    third_secret = final_file.read_text().strip()
    assert not can_log_in(server, client_id, second_secret)
    assert not can_log_in(server, client_id, app_secret)
    assert can_log_in(server, client_id, third_secret)
    old_session = cli(server, "spend", "today", env=runtime)
    assert old_session.returncode == 3 and "UNAUTHORIZED" in old_session.stderr

    # The org secret is rotated the same way.
    org_rotated = cli(server, "org", "rotate", "--org", org_id, "--grace-hours", "0", "--json", env=admin)
    assert org_rotated.returncode == 0, org_rotated.stderr
    assert not can_log_in(server, f"org-{org_id}", org_secret)
    assert can_log_in(server, f"org-{org_id}", json.loads(org_rotated.stdout)["client_secret"])


def test_revoke_a_token(server, tmp_path):
    org_id = str(uuid.uuid4())
    (tmp_path / "org.yaml").write_text(ORG_YAML.format(org_id=org_id))
    created = cli(
        server, "org", "apply", str(tmp_path / "org.yaml"), "--json", env={"PRICE_KEEPER_API_KEY": server.api_key}
    )
    creds = json.loads(created.stdout)
    tokens = requests.post(
        f"{server.url}/auth/token",
        timeout=10,
        json={
            "client_id": creds["client_id"],
            "client_secret": creds["client_secret"],
            "grant_type": "client_credentials",
        },
    ).json()
    env = {"PRICE_KEEPER_CLIENT_ID": creds["client_id"], "PRICE_KEEPER_CLIENT_SECRET": creds["client_secret"]}
    revoked = cli(server, "revoke", "-", "--hint", "refresh_token", env=env, stdin=tokens["refresh_token"] + "\n")
    assert revoked.returncode == 0, revoked.stderr
    refresh = requests.post(
        f"{server.url}/auth/refresh",
        timeout=10,
        json={"refresh_token": tokens["refresh_token"], "grant_type": "refresh_token"},
    )
    assert refresh.status_code == 401


@pytest.mark.parametrize(
    "case",
    [
        "no_key",
        "unknown_field",
        "bad_yaml",
        "missing_org",
        "unknown_org",
        "bad_day",
        "bad_grace",
        "wrong_key",
        "no_client",
        "unreachable",
    ],
)
def test_errors_are_one_line_with_an_exit_code(server, tmp_path, case):
    admin = {"PRICE_KEEPER_API_KEY": server.api_key}
    spec = tmp_path / "spec.yaml"
    org_id = str(uuid.uuid4())
    spec.write_text(ORG_YAML.format(org_id=org_id))
    args, env, expected = {
        "no_key": (["org", "apply", str(spec)], {}, 3),
        "unknown_field": (["org", "apply", str(spec)], admin, 2),
        "bad_yaml": (["org", "apply", str(spec)], admin, 2),
        "missing_org": (["app", "apply", str(spec)], admin, 2),
        "unknown_org": (["app", "apply", str(spec)], admin, 4),
        "bad_day": (
            ["spend", "yesterday"],
            {"PRICE_KEEPER_CLIENT_ID": f"org-{org_id}", "PRICE_KEEPER_CLIENT_SECRET": "x"},
            2,
        ),
        "bad_grace": (["org", "rotate", "--org", org_id, "--grace-hours", "500"], admin, 2),
        "wrong_key": (["org", "apply", str(spec)], {"PRICE_KEEPER_API_KEY": "wrong"}, 3),
        "no_client": (["spend", "today", "--org", org_id], {}, 3),
        "unreachable": (["org", "apply", str(spec), "--url", "http://127.0.0.1:9"], admin, 1),
    }[case]
    if case == "unknown_field":
        spec.write_text(ORG_YAML.format(org_id=org_id) + "colour: blue\n")
    elif case == "bad_yaml":
        spec.write_text("org_id: [unclosed\n")
    elif case == "missing_org":
        spec.write_text("app_id: chatbot\napp_name: x\n")
    elif case == "unknown_org":
        spec.write_text(APP_YAML.format(org_id=org_id))
    elif case == "bad_grace":
        cli(server, "org", "apply", str(spec), env=admin)
    run = cli(server, *args, env=env)
    assert run.returncode == expected, (run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("price-keeper: error: "), run.stderr
    assert "Traceback" not in run.stderr


def test_bad_arguments_exit_2(server):
    run = cli(server, "spend")
    assert run.returncode == 2 and "usage:" in run.stderr


def test_model_shows_the_recommendation_and_exits_5_when_every_quota_is_spent(server, tmp_path):
    org_id = str(uuid.uuid4())
    (tmp_path / "org.yaml").write_text(
        f"org_id: {org_id}\norg_name: Tiny\ntimezone: UTC\nquota_scope: APP\n"
        "model_ordering: [economy]\nquotas: {economy: 100}\n"
    )
    (tmp_path / "app.yaml").write_text(f"org_id: {org_id}\napp_id: batch-jobs\napp_name: Batch jobs\n")
    admin = {"PRICE_KEEPER_API_KEY": server.api_key}
    assert cli(server, "org", "apply", str(tmp_path / "org.yaml"), env=admin).returncode == 0
    app = json.loads(cli(server, "app", "apply", str(tmp_path / "app.yaml"), "--json", env=admin).stdout)
    env = {"PRICE_KEEPER_CLIENT_ID": app["client_id"], "PRICE_KEEPER_CLIENT_SECRET": app["client_secret"]}

    model = cli(server, "model", env=env)
    assert model.returncode == 0, model.stderr
    assert model.stdout.startswith("economy (amazon.nova-micro-v1:0) · mode NORMAL · reason NORMAL")

    with PriceKeeper(server.url, app["client_id"], app["client_secret"]) as keeper:
        keeper.report_usage(
            UsageRecord(str(uuid.uuid4()), "economy", "amazon.nova-micro-v1:0", 10_000, 0, datetime.now(UTC))
        )
    spent = wait_for(
        lambda: (lambda run: run if run.returncode == 5 else None)(cli(server, "model", "--force", env=env))
    )
    assert spent, "model never reported the exhausted quota"
    assert re.fullmatch(
        r"price-keeper: error: QUOTA_EXCEEDED: .+; quotas reset at \d{4}-\d\d-\d\dT00:00:00Z.*\n", spent.stderr
    )


def test_revoke_tokens_of_an_app_and_of_an_org(server):
    org_id = str(uuid.uuid4())
    org = server.provisioning().put_org(org_id, ORG_DEFAULTS).credentials
    app = server.provisioning().put_app(org_id, "chatbot", {"app_name": "Support chatbot"}).credentials
    admin = {"PRICE_KEEPER_API_KEY": server.api_key}

    def session(client_id: str, secret: str) -> dict:
        return requests.post(
            f"{server.url}/auth/token",
            timeout=10,
            json={"client_id": client_id, "client_secret": secret, "grant_type": "client_credentials"},
        ).json()

    def refreshes(session: dict) -> bool:
        reply = requests.post(
            f"{server.url}/auth/refresh",
            timeout=10,
            json={"refresh_token": session["refresh_token"], "grant_type": "refresh_token"},
        )
        assert reply.status_code in (200, 401), reply.text
        return reply.status_code == 200

    app_session, org_session = session(app.client_id, app.client_secret), session(org.client_id, org.client_secret)
    run = cli(server, "app", "revoke-tokens", "--org", org_id, "--app", "chatbot", env=admin)
    assert run.returncode == 0, run.stderr
    assert f"org-{org_id}-app-chatbot" in run.stdout and "secret still works" in run.stdout
    assert not refreshes(app_session) and refreshes(org_session)
    assert can_log_in(server, app.client_id, app.client_secret)

    run = cli(server, "org", "revoke-tokens", "--org", org_id, "--json", env=admin)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"org_id": org_id, "app_id": None, "client_id": f"org-{org_id}", "revoked": True}
    assert not refreshes(org_session)

    unknown = cli(server, "app", "revoke-tokens", "--org", org_id, "--app", "nope", env=admin)
    assert unknown.returncode == 4 and unknown.stderr.startswith("price-keeper: error: NOT_FOUND")
