"""Deploy, diff or destroy one stage of the stack, with the context its account needs.

Usage (``make deploy``, ``make diff`` and ``make destroy`` run it with ``STAGE`` and ``CDK_ARGS``)::

    .venv/bin/python -m tools.deploy deploy  [--stage S] [--dry-run] [--no-smoke] [-- CDK_ARGS...]
    .venv/bin/python -m tools.deploy diff    [--stage S] [-- CDK_ARGS...]
    .venv/bin/python -m tools.deploy destroy [--stage S] [-- CDK_ARGS...]

A bare ``cdk deploy`` cannot know two things about the account it deploys to, and both
decide whether a first deploy succeeds:

- **The account's Lambda concurrency limit** (``lambda:GetAccountSettings``). Lambda refuses
  a reservation that leaves fewer than 100 executions unreserved, and new accounts often have
  a limit of 10 or 50. The tool passes the limit as ``accountConcurrency``; the stack
  (``reserveConcurrency=auto``) then reserves only where there is room.
- **Whether the stack exists.** The three money tables are ``RetainExceptOnCreate``: a
  create that fails deletes them again, so that a retry does not meet tables of the same
  names. DynamoDB refuses to delete a table with deletion protection, so a stage's first
  create runs with ``deletionProtection=false``, and once it succeeded a second deploy turns
  protection on (an in-place update of the three tables). A stack in ``ROLLBACK_COMPLETE``
  (a failed create, which cdk deletes before creating again) counts as no stack.

Before a first create the tool refuses when tables or secrets of the stage's names exist
already (left by ``make destroy``, or by a create that failed before the tables were
``RetainExceptOnCreate``): CloudFormation would fail on them only after minutes of creating
everything else, then roll it all back. After a deploy it runs the smoke test
(tests/test_smoke.py, as ``make smoke`` does) against the stage's ``ApiUrl``, with the
provisioning key read from Secrets Manager and handed over in the environment: never on a
command line, which ``make`` would echo, nor in the output.

``deploy --dry-run`` and ``diff`` print the plan and run ``cdk diff`` with the context of its
next deploy. Arguments after ``--`` go to cdk unchanged, except that ``-c stage=S`` there
works as ``--stage S`` does, ``-c accountConcurrency=N`` replaces the lookup (for credentials
without ``lambda:GetAccountSettings``), ``-c deletionProtection=false`` keeps protection off
after a first create, and ``-c region=R`` and ``--profile P`` also apply to the tool's own
reads, so that they see the account and region cdk deploys to.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence

import boto3
from botocore.exceptions import BotoCoreError, ClientError

# First: ``stacks`` puts the shared layer's source (price_keeper) on sys.path. It imports no CDK.
import stacks
from price_keeper.store.tables import ALL_TABLES

DEFAULT_STAGE = "dev"  # Settings.stage and cdk.json's context
CDK = ("npx", "--no-install", "cdk")
# As the Makefile's CDK: jsii's banners about the Node.js version say nothing about the deploy.
CDK_ENV = {"JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}

# The reservations of stacks/functions.py (SIZING, UNRESERVED_MINIMUM), copied rather than
# imported because importing the stacks' code loads the CDK (seconds, and Node.js) for a tool
# that may only destroy; tests/test_deploy_tool.py checks that the two agree.
RESERVED = {"aggregator": 100, "model_selection": 200}
UNRESERVED_MINIMUM = 100

MONEY_TABLES = tuple(spec.name for spec in ALL_TABLES if spec.holds_money)
SECRETS = ("jwt-signing-key", "provisioning-api-key")  # stacks/price_keeper_stack.py

# Statuses of a stack that holds no resources: cdk deploy creates the stack again (deleting a
# ROLLBACK_COMPLETE one first), so the deploy is a first create.
NOT_CREATED = frozenset({"ROLLBACK_COMPLETE", "REVIEW_IN_PROGRESS", "DELETE_COMPLETE"})

# Context the tool decides itself; the same keys in the arguments after ``--`` are read and
# replaced, never passed twice.
OWN_CONTEXT = ("stage", "accountConcurrency", "deletionProtection")

Runner = Callable[[list[str], dict[str, str]], int]


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


# --- names, as the stack derives them ------------------------------------------------------


def stack_name(stage: str) -> str:
    return f"PriceKeeper-{stage}"  # app.py


def table_prefix(stage: str, given: str | None = None) -> str:
    return given or f"price-keeper-{stage}-"  # Settings.prefix


def secret_prefix(stage: str) -> str:
    return f"price-keeper/{stage}/"  # Settings.secret_prefix


# --- the arguments after ``--`` ------------------------------------------------------------


def _context_pairs(args: Sequence[str]) -> Iterable[tuple[int, int, str, str]]:
    """(start, end, key, value) of each ``-c key=value``, ``--context key=value`` and
    ``--context=key=value`` in ``args``; ``args[start:end]`` is the whole flag."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in ("-c", "--context") and index + 1 < len(args):
            key, _, value = args[index + 1].partition("=")
            yield index, index + 2, key, value
            index += 2
            continue
        if arg.startswith("--context="):
            key, _, value = arg.removeprefix("--context=").partition("=")
            yield index, index + 1, key, value
        index += 1


def context_values(args: Sequence[str]) -> dict[str, str]:
    """The context ``args`` set (the last value of a key wins)."""
    return {key: value for _, _, key, value in _context_pairs(args)}


def drop_context(args: Sequence[str], keys: Iterable[str]) -> list[str]:
    """``args`` without the context flags of ``keys``."""
    keys = set(keys)
    dropped = {i for start, end, key, _ in _context_pairs(args) if key in keys for i in range(start, end)}
    return [arg for i, arg in enumerate(args) if i not in dropped]


def option(args: Sequence[str], name: str) -> str | None:
    """The value of a cdk option such as ``--profile P`` or ``--profile=P`` in ``args``."""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.removeprefix(name + "=")
    return None


def _flag(value: str | None, default: bool) -> bool:
    """A context flag as stacks/settings.py reads it."""
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


# --- the decisions -------------------------------------------------------------------------


def reserve_note(account_concurrency: int, reserve: str = "auto") -> str:
    """What the stack reserves on an account of this limit, and why: the rule of
    ``stacks.functions.reserved_concurrency`` in words."""
    reserve = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(
        reserve.strip().lower(), reserve.strip().lower()
    )
    wanted = sum(RESERVED.values())
    needed = wanted + UNRESERVED_MINIMUM
    head = f"account concurrency {account_concurrency}"
    if reserve == "false":
        return f"{head}: no reserved concurrency (reserveConcurrency=false)"
    if account_concurrency >= needed:
        each = ", ".join(f"{name} {count}" for name, count in RESERVED.items())
        return f"{head}: reserves {wanted} ({each}), {account_concurrency - wanted} stay unreserved"
    if reserve == "true":
        return (
            f"{head}: reserveConcurrency=true needs at least {needed}, so the synth will refuse "
            "(ask AWS for a higher limit, or leave reserveConcurrency at auto)"
        )
    return f"{head}: no reserved concurrency (needs at least {needed})"


def created(status: str | None) -> bool:
    """Whether a stack of this status (None: no stack) holds the stage's resources; if not,
    the next deploy is a first create."""
    return status is not None and status not in NOT_CREATED


def stack_note(name: str, status: str | None, protect: bool) -> str:
    """Why a deploy runs once or twice."""
    if created(status):
        return f"{name} exists ({status}): one deploy, deletion protection {'on' if protect else 'off'}"
    found = "does not exist" if status is None else f"holds nothing ({status})"
    then = "then a second deploy turns protection on" if protect else "protection stays off (deletionProtection=false)"
    return (
        f"{name} {found}: a first create, without deletion protection so that a failed create "
        f"deletes its tables again; {then}"
    )


def plan(
    account_concurrency: int,
    stack_exists: bool,
    stage: str,
    dry_run: bool = False,
    *,
    protect: bool = True,
    extra: Sequence[str] = (),
) -> list[list[str]]:
    """The cdk commands (the arguments after ``cdk``) of a deploy of ``stage``, in order.

    A first create runs without deletion protection and, when ``protect``, a second deploy
    turns it on; an existing stack gets one deploy. A dry run is the ``cdk diff`` of the
    first of those. ``extra`` (the arguments after ``--``, without ``OWN_CONTEXT``) ends
    every command."""
    context = ["-c", f"stage={stage}", "-c", f"accountConcurrency={account_concurrency}"]

    def deploy(protected: bool) -> list[str]:
        return ["deploy", stack_name(stage), *context, "-c", f"deletionProtection={str(protected).lower()}", *extra]

    steps = [deploy(protect)] if stack_exists else [deploy(False), *([deploy(True)] if protect else [])]
    if dry_run:
        return [["diff", *steps[0][1:]]]
    return steps


def retained_note(stage: str, prefix: str | None = None, region: str | None = None) -> str:
    """What ``cdk destroy`` leaves behind, and the commands that delete it for good."""
    where = f" --region {region}" if region else ""
    names = [table_prefix(stage, prefix) + table for table in MONEY_TABLES]
    lines = [
        f"kept: the money tables {', '.join(names)} (DeletionPolicy RetainExceptOnCreate: a destroy",
        "    leaves them, data, point-in-time recovery and deletion protection included). To delete them",
        "    for good (every org's credentials and spend; export them first if they matter):",
    ]
    for name in names:
        lines.append(f"    aws dynamodb update-table --table-name {name} --no-deletion-protection-enabled{where}")
        lines.append(f"    aws dynamodb delete-table --table-name {name}{where}")
    return "\n".join(lines)


# --- AWS -----------------------------------------------------------------------------------


class Account:
    """The tool's reads of the account, through one boto3 session: the profile and region cdk
    deploys with, so that the tool sees the stack cdk will change."""

    def __init__(self, session: boto3.Session):
        self.session = session
        self._clients: dict[str, object] = {}

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = self.session.client(service)
        return self._clients[service]

    def concurrency_limit(self) -> int:
        """The account's concurrent-executions limit in the region."""
        return self.client("lambda").get_account_settings()["AccountLimit"]["ConcurrentExecutions"]

    def stack_status(self, name: str) -> str | None:
        """The stack's status, or None when CloudFormation has no stack of that name."""
        try:
            return self.client("cloudformation").describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
        except ClientError as error:
            if error.response["Error"]["Code"] == "ValidationError" and "does not exist" in str(error):
                return None
            raise

    def outputs(self, name: str) -> dict[str, str]:
        stack = self.client("cloudformation").describe_stacks(StackName=name)["Stacks"][0]
        return {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}

    def leftovers(self, tables: Iterable[str], secrets: Iterable[str]) -> list[str]:
        """Which of these tables and secrets exist (a secret scheduled for deletion still
        holds its name)."""
        found = []
        for name in tables:
            try:
                self.client("dynamodb").describe_table(TableName=name)
            except self.client("dynamodb").exceptions.ResourceNotFoundException:
                continue
            found.append(f"table {name}")
        for name in secrets:
            try:
                secret = self.client("secretsmanager").describe_secret(SecretId=name)
            except self.client("secretsmanager").exceptions.ResourceNotFoundException:
                continue
            found.append(f"secret {name}" + (" (scheduled for deletion)" if secret.get("DeletedDate") else ""))
        return found

    def secret_value(self, secret_id: str) -> str:
        return self.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"]


# --- the commands --------------------------------------------------------------------------


def run_command(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` from the repository root (cdk.json is there), its output the user's."""
    print("$ " + shlex.join(command), flush=True)
    return subprocess.run(command, cwd=stacks.REPO_ROOT, env=env, check=False).returncode


def cdk_env() -> dict[str, str]:
    return {**CDK_ENV, **os.environ}


def deploy(
    stage: str, extra: list[str], context: dict[str, str], account: Account, run: Runner, *, dry_run: bool, smoke: bool
) -> int:
    """Plan the deploy from what the account says, check the names a first create needs,
    run the plan (or its diff) and then the smoke test."""
    name = stack_name(stage)
    if "accountConcurrency" in context:
        limit = int(context["accountConcurrency"])
    else:
        limit = account.concurrency_limit()
    status = account.stack_status(name)
    exists = created(status)
    protect = _flag(context.get("deletionProtection"), True)
    say(reserve_note(limit, context.get("reserveConcurrency", "auto")))
    say(stack_note(name, status, protect))

    if not exists:
        left = account.leftovers(
            [table_prefix(stage, context.get("tablePrefix")) + table for table in MONEY_TABLES],
            [secret_prefix(stage) + secret for secret in SECRETS],
        )
        if left:
            say(
                f"{name} has no stack, but names its create needs are taken: {'; '.join(left)}. The create "
                "would fail on them, after minutes: delete them (docs/infrastructure.md, Teardown), or keep "
                "the tables and deploy with another -c tablePrefix=..."
            )
            if not dry_run:
                return 1

    steps = plan(limit, exists, stage, dry_run, protect=protect, extra=extra)
    if dry_run:
        for step in plan(limit, exists, stage, protect=protect, extra=extra):
            say("would run: " + shlex.join([*CDK, *step]))
    for number, step in enumerate(steps, 1):
        code = run([*CDK, *step], cdk_env())
        if code:
            if not exists and number == 1 and not dry_run:
                say(
                    f"the first create failed (cdk exit {code}); a rollback deletes its tables too: "
                    "fix the cause, then deploy again"
                )
            elif number == 2:
                say(f"{name} is deployed, but its money tables are not protected yet (cdk exit {code}): deploy again")
            return code
    if dry_run or not smoke:
        return 0
    return run_smoke(name, account, run)


def run_smoke(name: str, account: Account, run: Runner) -> int:
    """tests/test_smoke.py against the stack, as ``make smoke`` runs it."""
    outputs = account.outputs(name)
    url, secret = outputs["ApiUrl"], outputs["ProvisioningSecretArn"]
    say(f"smoke test against {url} (the provisioning key from {secret})")
    env = {**os.environ, "SMOKE_BASE_URL": url, "SMOKE_KEY": account.secret_value(secret)}
    code = run([sys.executable, "-m", "pytest", "-n", "0", "-m", "smoke"], env)
    if code:
        say(f"{name} is deployed, but its smoke test failed (exit {code})")
    return code


def destroy(stage: str, extra: list[str], context: dict[str, str], run: Runner) -> int:
    say(retained_note(stage, context.get("tablePrefix"), context.get("region")))
    return run([*CDK, "destroy", stack_name(stage), "-c", f"stage={stage}", *extra], cdk_env())


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="python -m tools.deploy",
        description="Deploy, diff or destroy a stage with the context its account needs.",
        epilog="Arguments after -- go to cdk (e.g. -- -c region=eu-west-1 -c alertEmail=ops@example.com).",
    )
    commands = cli.add_subparsers(dest="command", required=True)
    for command, text in (
        ("deploy", "deploy the stage (twice on a first create), then run the smoke test"),
        ("diff", "cdk diff with the context of the next deploy"),
        ("destroy", "cdk destroy (the money tables are kept)"),
    ):
        sub = commands.add_parser(command, help=text, description=text)
        sub.add_argument("--stage", help=f"the stage (default: -c stage=... after --, else {DEFAULT_STAGE})")
        if command == "deploy":
            sub.add_argument("--dry-run", action="store_true", help="print the plan and run cdk diff instead")
            sub.add_argument("--no-smoke", dest="smoke", action="store_false", help="skip the smoke test")
    return cli


def main(argv: Sequence[str] | None = None, *, account: Account | None = None, run: Runner = run_command) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    cli = parser()
    args = cli.parse_args(own)
    context = context_values(extra)
    if args.stage and context.get("stage", args.stage) != args.stage:
        cli.error(f"--stage {args.stage} but -c stage={context['stage']}")
    stage = args.stage or context.get("stage") or DEFAULT_STAGE
    extra = drop_context(extra, OWN_CONTEXT)

    if args.command == "destroy":
        return destroy(stage, extra, context, run)
    try:
        if account is None:
            account = Account(boto3.Session(profile_name=option(extra, "--profile"), region_name=context.get("region")))
        return deploy(
            stage,
            extra,
            context,
            account,
            run,
            dry_run=args.command == "diff" or args.dry_run,
            smoke=args.command == "deploy" and args.smoke,
        )
    except (BotoCoreError, ClientError) as error:
        say(f"AWS: {error}")
        if isinstance(error, ClientError) and error.operation_name == "GetAccountSettings":
            say("without lambda:GetAccountSettings, give the limit: -- -c accountConcurrency=N")
        return 1


if __name__ == "__main__":
    sys.exit(main())
