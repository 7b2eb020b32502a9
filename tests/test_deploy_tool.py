"""tools/deploy.py, the ``make deploy``/``diff``/``destroy`` wrapper: its decisions as pure
functions, its reads of the account on moto, and its cdk and smoke-test runs with a stand-in
for cdk (a runner that does to moto what a deploy does, or a fake ``npx`` on the PATH).

moto 5 does not implement ``lambda:GetAccountSettings`` (it answers "Not yet implemented"),
so the account's limit comes from botocore's Stubber on the tool's own Lambda client: the
real call and the real parsing of its answer, with the answer given."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid

import boto3
import pytest
from botocore.stub import Stubber

from tools import deploy
from tools.deploy import CDK, Account, plan, reserve_note

STAGE = "qa"
STACK = "PriceKeeper-qa"
ROOT = deploy.stacks.REPO_ROOT


def context(stage: str, limit: int, protect: bool) -> list[str]:
    return [
        "-c",
        f"stage={stage}",
        "-c",
        f"accountConcurrency={limit}",
        "-c",
        f"deletionProtection={str(protect).lower()}",
    ]


# --- pure decisions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "reserve", "note"),
    [
        (10, "auto", "account concurrency 10: no reserved concurrency (needs at least 400)"),
        (50, "auto", "account concurrency 50: no reserved concurrency (needs at least 400)"),
        (399, "auto", "account concurrency 399: no reserved concurrency (needs at least 400)"),
        (
            400,
            "auto",
            "account concurrency 400: reserves 300 (aggregator 100, model_selection 200), 100 stay unreserved",
        ),
        (
            1000,
            "true",
            "account concurrency 1000: reserves 300 (aggregator 100, model_selection 200), 700 stay unreserved",
        ),
        (1000, "false", "account concurrency 1000: no reserved concurrency (reserveConcurrency=false)"),
        (1000, "off", "account concurrency 1000: no reserved concurrency (reserveConcurrency=false)"),
    ],
)
def test_reserve_note_says_what_the_account_gets_and_why(limit, reserve, note):
    assert reserve_note(limit, reserve) == note


def test_reserve_note_warns_that_a_forced_reservation_will_not_synth():
    assert "reserveConcurrency=true needs at least 400, so the synth will refuse" in reserve_note(50, "true")


@pytest.mark.parametrize("limit", [10, 50, 399, 400, 1000])
def test_reserve_note_agrees_with_the_stack(limit):
    """The tool's copy of the rule reserves where stacks/functions.py does, the same counts."""
    from stacks.functions import UNRESERVED_MINIMUM, reserved_concurrency
    from stacks.settings import Settings

    reserved = reserved_concurrency(Settings(account_concurrency=limit))
    assert deploy.UNRESERVED_MINIMUM == UNRESERVED_MINIMUM
    assert reserved in ({}, deploy.RESERVED)
    assert ("no reserved concurrency" not in reserve_note(limit)) == bool(reserved)


def test_names_agree_with_the_stack_settings():
    from stacks.settings import Settings

    assert deploy.table_prefix("qa") == Settings(stage="qa").prefix
    assert deploy.table_prefix("qa", "pk-2-") == Settings(stage="qa", table_prefix="pk-2-").prefix
    assert deploy.secret_prefix("qa") == Settings(stage="qa").secret_prefix
    assert deploy.MONEY_TABLES == ("config", "usage-agg-sharded", "daily-total")
    source = (ROOT / "stacks" / "price_keeper_stack.py").read_text()
    assert 'f"PriceKeeper-{settings.stage}"' in (ROOT / "app.py").read_text()
    for name in (
        "ApiUrl",
        "ProvisioningSecretArn",
        *(f"{{settings.secret_prefix}}{secret}" for secret in deploy.SECRETS),
    ):
        assert f'"{name}"' in source


def test_a_first_create_deploys_unprotected_then_protected():
    extra = ["-c", "alertEmail=ops@example.com", "--require-approval", "never"]
    assert plan(10, False, STAGE, extra=extra) == [
        ["deploy", STACK, *context(STAGE, 10, False), *extra],
        ["deploy", STACK, *context(STAGE, 10, True), *extra],
    ]


def test_an_existing_stack_is_deployed_once_protected():
    assert plan(1000, True, STAGE) == [["deploy", STACK, *context(STAGE, 1000, True)]]


def test_deletion_protection_false_keeps_it_off():
    assert plan(10, False, STAGE, protect=False) == [["deploy", STACK, *context(STAGE, 10, False)]]
    assert plan(10, True, STAGE, protect=False) == [["deploy", STACK, *context(STAGE, 10, False)]]


def test_a_dry_run_diffs_the_next_deploy():
    assert plan(10, False, STAGE, dry_run=True) == [["diff", STACK, *context(STAGE, 10, False)]]
    assert plan(10, True, STAGE, dry_run=True) == [["diff", STACK, *context(STAGE, 10, True)]]


@pytest.mark.parametrize(
    ("status", "first_create"),
    [
        (None, True),
        ("ROLLBACK_COMPLETE", True),  # a failed create: cdk deletes it and creates again
        ("REVIEW_IN_PROGRESS", True),
        ("CREATE_COMPLETE", False),
        ("UPDATE_ROLLBACK_COMPLETE", False),
    ],
)
def test_a_stack_that_holds_nothing_means_a_first_create(status, first_create):
    assert deploy.created(status) is not first_create
    assert ("a first create" in deploy.stack_note(STACK, status, True)) is first_create


def test_the_arguments_after_dashes_give_context_and_keep_the_rest():
    args = ["-c", "stage=qa", "--context", "region=eu-west-1", "--context=accountConcurrency=7", "--profile", "ops"]
    assert deploy.context_values(args) == {"stage": "qa", "region": "eu-west-1", "accountConcurrency": "7"}
    assert deploy.drop_context(args, deploy.OWN_CONTEXT) == ["--context", "region=eu-west-1", "--profile", "ops"]
    assert deploy.option(args, "--profile") == "ops"
    assert deploy.option(["--profile=ops"], "--profile") == "ops"
    assert deploy.option(args, "--region") is None


def test_a_stage_given_twice_must_agree():
    with pytest.raises(SystemExit):
        deploy.main(["diff", "--stage", "qa", "--", "-c", "stage=prod"], run=lambda command, env: 0)


def test_the_retained_note_names_the_tables_and_the_commands():
    note = deploy.retained_note("qa", region="eu-west-1")
    for table in ("price-keeper-qa-config", "price-keeper-qa-usage-agg-sharded", "price-keeper-qa-daily-total"):
        assert f"--table-name {table} --no-deletion-protection-enabled --region eu-west-1" in note
        assert f"aws dynamodb delete-table --table-name {table} --region eu-west-1" in note


# --- on moto -------------------------------------------------------------------------------


def account_with_limit(limit: int) -> Account:
    """An Account on moto whose Lambda client answers GetAccountSettings with ``limit``."""
    account = Account(boto3.Session())
    stubber = Stubber(account.client("lambda"))
    stubber.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": limit}})
    stubber.activate()
    return account


def create_stack(stage: str) -> tuple[str, str]:
    """What a deploy leaves in the account, as far as the tool reads it: the stack with its
    ``ApiUrl`` and ``ProvisioningSecretArn`` outputs, and the secret. (url, key)."""
    key, url = uuid.uuid4().hex, f"https://api.example.com/{stage}/"
    arn = boto3.client("secretsmanager").create_secret(
        Name=f"price-keeper/{stage}/provisioning-api-key", SecretString=key
    )["ARN"]
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"ApiUrl": {"Value": url}, "ProvisioningSecretArn": {"Value": arn}},
    }
    boto3.client("cloudformation").create_stack(StackName=f"PriceKeeper-{stage}", TemplateBody=json.dumps(template))
    return url, key


class FakeCdk:
    """The runner in place of ``npx cdk`` and pytest: records each command with its
    environment; a ``cdk deploy`` of a stage with no stack creates it in moto, as the real
    one would; the command numbered ``fail_at`` (from 1) exits 1."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.runs: list[tuple[list[str], dict[str, str]]] = []
        self.deployed: tuple[str, str] | None = None

    def __call__(self, command: list[str], env: dict[str, str]) -> int:
        self.runs.append((command, env))
        if len(self.runs) == self.fail_at:
            return 1
        if command[: len(CDK) + 1] == [*CDK, "deploy"] and self.deployed is None:
            stage = deploy.context_values(command)["stage"]
            if not deploy.created(Account(boto3.Session()).stack_status(f"PriceKeeper-{stage}")):
                self.deployed = create_stack(stage)
        return 0

    @property
    def commands(self) -> list[list[str]]:
        return [command for command, _ in self.runs]


def test_the_account_reads_on_moto(aws):
    account = Account(boto3.Session())
    assert account.stack_status(STACK) is None
    assert account.leftovers(["price-keeper-qa-config"], ["price-keeper/qa/jwt-signing-key"]) == []

    url, key = create_stack(STAGE)
    boto3.client("dynamodb").create_table(
        TableName="price-keeper-qa-config",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    sm = boto3.client("secretsmanager")
    sm.create_secret(Name="price-keeper/qa/jwt-signing-key", SecretString="x")
    sm.delete_secret(SecretId="price-keeper/qa/jwt-signing-key")

    assert account.stack_status(STACK) == "CREATE_COMPLETE"
    outputs = account.outputs(STACK)
    assert outputs["ApiUrl"] == url
    assert account.secret_value(outputs["ProvisioningSecretArn"]) == key
    assert account.leftovers(
        ["price-keeper-qa-config", "price-keeper-qa-daily-total"],
        ["price-keeper/qa/jwt-signing-key", "price-keeper/qa/provisioning-api-key"],
    ) == [
        "table price-keeper-qa-config",
        "secret price-keeper/qa/jwt-signing-key (scheduled for deletion)",
        "secret price-keeper/qa/provisioning-api-key",
    ]
    assert account_with_limit(10).concurrency_limit() == 10


def test_a_first_create_deploys_twice_then_runs_the_smoke_test(aws, capsys):
    cdk = FakeCdk()
    extra = ["-c", "alertEmail=ops@example.com"]
    code = deploy.main(["deploy", "--stage", STAGE, "--", *extra], account=account_with_limit(10), run=cdk)

    assert code == 0
    url, key = cdk.deployed
    assert cdk.commands == [
        [*CDK, "deploy", STACK, *context(STAGE, 10, False), *extra],
        [*CDK, "deploy", STACK, *context(STAGE, 10, True), *extra],
        [sys.executable, "-m", "pytest", "-n", "0", "-m", "smoke"],
    ]
    cdk_env, smoke_env = cdk.runs[0][1], cdk.runs[2][1]
    assert cdk_env["JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION"] == "1" and "SMOKE_KEY" not in cdk_env
    assert (smoke_env["SMOKE_BASE_URL"], smoke_env["SMOKE_KEY"]) == (url, key)
    out = capsys.readouterr().out
    assert "account concurrency 10: no reserved concurrency (needs at least 400)" in out
    assert "PriceKeeper-qa does not exist: a first create" in out
    assert f"smoke test against {url}" in out
    assert key not in out


def test_an_existing_stack_is_deployed_once(aws, capsys):
    create_stack(STAGE)
    cdk = FakeCdk()
    code = deploy.main(["deploy", "--no-smoke", "--", "-c", "stage=qa"], account=account_with_limit(1000), run=cdk)

    assert code == 0
    assert cdk.commands == [[*CDK, "deploy", STACK, *context(STAGE, 1000, True)]]
    assert "reserves 300 (aggregator 100, model_selection 200), 700 stay unreserved" in capsys.readouterr().out


def test_a_given_limit_replaces_the_lookup_and_dry_run_diffs(aws, capsys):
    cdk = FakeCdk()
    code = deploy.main(["deploy", "--stage", STAGE, "--dry-run", "--", "-c", "accountConcurrency=50"], run=cdk)

    assert code == 0
    assert cdk.commands == [[*CDK, "diff", STACK, *context(STAGE, 50, False)]]
    out = capsys.readouterr().out
    assert "would run: npx --no-install cdk deploy PriceKeeper-qa" in out
    assert out.count("would run:") == 2


def test_names_left_behind_stop_a_first_create_before_cdk(aws, capsys):
    boto3.client("dynamodb").create_table(
        TableName="price-keeper-qa-daily-total",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    cdk = FakeCdk()
    code = deploy.main(["deploy", "--stage", STAGE], account=account_with_limit(1000), run=cdk)

    assert code == 1
    assert cdk.commands == []
    assert "names its create needs are taken: table price-keeper-qa-daily-total" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fail_at", "runs", "message"),
    [
        (1, 1, "the first create failed (cdk exit 1); a rollback deletes its tables too"),
        (2, 2, "PriceKeeper-qa is deployed, but its money tables are not protected yet"),
        (3, 3, "PriceKeeper-qa is deployed, but its smoke test failed"),
    ],
)
def test_a_failed_step_stops_the_deploy_and_says_where(aws, capsys, fail_at, runs, message):
    cdk = FakeCdk(fail_at=fail_at)
    code = deploy.main(["deploy", "--stage", STAGE], account=account_with_limit(10), run=cdk)

    assert code == 1
    assert len(cdk.runs) == runs
    assert message in capsys.readouterr().out


# --- the real subprocess, with a fake npx on the PATH --------------------------------------


@pytest.fixture
def fake_npx(tmp_path, monkeypatch):
    """An ``npx`` that logs its arguments (and one variable of its environment) and exits
    with FAKE_CDK_EXIT; returns the log."""
    log = tmp_path / "npx.log"
    npx = tmp_path / "bin" / "npx"
    npx.parent.mkdir()
    npx.write_text(
        '#!/bin/sh\nprintf "%s|jsii=%s|cwd=%s\\n" "$*" "$JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION" "$PWD"'
        f' >> "{log}"\nexit "${{FAKE_CDK_EXIT:-0}}"\n'
    )
    npx.chmod(npx.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{npx.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_diff_runs_cdk_from_the_path(aws, fake_npx):
    code = deploy.main(["diff", "--stage", STAGE, "--", "-c", "accountConcurrency=1000", "-c", "region=us-east-1"])

    assert code == 0
    assert fake_npx.read_text().splitlines() == [
        "--no-install cdk diff PriceKeeper-qa -c stage=qa -c accountConcurrency=1000 -c deletionProtection=false"
        f" -c region=us-east-1|jsii=1|cwd={ROOT}"
    ]


def test_destroy_says_what_it_keeps_and_passes_cdk_exit_code(fake_npx, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_CDK_EXIT", "3")
    code = deploy.main(["destroy", "--", "-c", "stage=prod", "-c", "tablePrefix=pk-prod-2-", "--force"])

    assert code == 3
    assert fake_npx.read_text().splitlines() == [
        f"--no-install cdk destroy PriceKeeper-prod -c stage=prod -c tablePrefix=pk-prod-2- --force|jsii=1|cwd={ROOT}"
    ]
    out = capsys.readouterr().out
    assert "kept: the money tables pk-prod-2-config, pk-prod-2-usage-agg-sharded, pk-prod-2-daily-total" in out
    assert "aws dynamodb delete-table --table-name pk-prod-2-daily-total" in out


@pytest.mark.parametrize("target", ["deploy", "diff", "destroy"])
def test_the_make_targets_call_the_tool_with_stage_and_cdk_args(target):
    made = subprocess.run(
        ["make", "-n", target, "STAGE=qa", "CDK_ARGS=-c region=eu-west-1 --profile ops"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [line for line in made.stdout.splitlines() if "tools.deploy" in line]
    assert line.split()[1:] == [
        *("-m", "tools.deploy", target, "--stage", "qa"),
        *("--", "-c", "region=eu-west-1", "--profile", "ops"),
    ]
