"""``price-keeper``: the operator's command line.

    price-keeper org apply FILE.yaml [--secret-file PATH]
    price-keeper app apply FILE.yaml [--secret-file PATH]
    price-keeper org rotate --org ID [--app ID] --grace-hours N [--secret-file PATH]
    price-keeper org revoke-tokens --org ID
    price-keeper app revoke-tokens --org ID --app ID
    price-keeper revoke TOKEN|- [--hint access_token|refresh_token]
    price-keeper spend today|YYYY-MM-DD [--org ID] [--app ID]
    price-keeper model [--org ID] [--app ID] [--force]

Every command takes ``--url`` (default ``$PRICE_KEEPER_URL`` or the local stack) and
``--json``. Provisioning commands use ``$PRICE_KEEPER_API_KEY``; ``spend``, ``model`` and
``revoke`` use ``$PRICE_KEEPER_CLIENT_ID`` / ``$PRICE_KEEPER_CLIENT_SECRET``.

Exit codes: 0 ok, 1 other failure, 2 bad usage or input, 3 authentication, 4 not found,
5 quota exceeded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .admin import Provisioning
from .client import PriceKeeper, url_from_env
from .errors import (
    ConnectionFailed,
    Forbidden,
    InvalidConfig,
    InvalidModelLabel,
    InvalidRequest,
    NotFound,
    PriceKeeperError,
    QuotaExceeded,
    Unauthorized,
)
from .models import Credentials, Provisioned
from .spend_table import render

EXIT_OTHER, EXIT_USAGE, EXIT_AUTH, EXIT_NOT_FOUND, EXIT_QUOTA = 1, 2, 3, 4, 5
ORG_FIELDS = frozenset({"org_id", "org_name", "timezone", "quota_scope", "model_ordering", "quotas", "overrides"})
APP_FIELDS = frozenset({"org_id", "app_id", "app_name", "model_ordering", "quotas", "overrides"})
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
SECRET_WARNING = (
    "WARNING: store this client secret now (e.g. in AWS Secrets Manager). "
    "It is shown only once and cannot be retrieved again."
)


class UsageProblem(Exception):
    """Bad input on the command line or in a file (exit 2)."""


class AuthProblem(Exception):
    """Missing credentials in the environment (exit 3)."""


@dataclass
class Output:
    as_json: bool

    def emit(self, text: str, data: Any) -> None:
        print(json.dumps(data, indent=2, default=str) if self.as_json else text, flush=True)


# -- inputs ------------------------------------------------------------------------------------


def _load_spec(path: str, allowed: frozenset[str], required: Sequence[str]) -> dict:
    try:
        spec = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise UsageProblem(f"cannot read {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = getattr(error, "problem", None) or "cannot parse"
        raise UsageProblem(f"{where}: not valid YAML ({problem})") from error
    if not isinstance(spec, dict):
        raise UsageProblem(f"{path} must hold a mapping of fields")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise UsageProblem(f"{path}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = [name for name in required if not spec.get(name)]
    if missing:
        raise UsageProblem(f"{path}: missing {', '.join(missing)}")
    return {key: str(value) if key in ("org_id", "app_id") else value for key, value in spec.items()}


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise AuthProblem(f"set {name}")
    return value


def _provisioning(args) -> Provisioning:
    return Provisioning(args.url, _env("PRICE_KEEPER_API_KEY"))


def _keeper(args) -> PriceKeeper:
    client_id, client_secret = _env("PRICE_KEEPER_CLIENT_ID"), _env("PRICE_KEEPER_CLIENT_SECRET")
    try:
        return PriceKeeper(
            args.url, client_id, client_secret, org_id=getattr(args, "org", None), app_id=getattr(args, "app", None)
        )
    except ValueError as error:
        raise AuthProblem(f"PRICE_KEEPER_CLIENT_ID: {error}") from error


def _write_secret(path: str, secret: str) -> None:
    """Writes the secret readable by the owner only (the file is created or replaced)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(secret + "\n")


def _show_credentials(
    out: Output, headline: str, data: dict, credentials: Credentials, secret_file: str | None
) -> None:
    """Prints new credentials once; with ``--secret-file`` the secret goes only to that file."""
    if secret_file:
        _write_secret(secret_file, credentials.client_secret)
        data = {**data, "client_secret": None, "secret_file": secret_file}
        out.emit(
            f"{headline}\n  client_id:     {credentials.client_id}\n  client_secret: written to {secret_file}", data
        )
        return
    out.emit(
        f"{headline}\n  client_id:     {credentials.client_id}\n  client_secret: {credentials.client_secret}", data
    )
    print(SECRET_WARNING, file=sys.stderr, flush=True)


# -- commands ----------------------------------------------------------------------------------


def _report_applied(out: Output, kind: str, name: str, result: Provisioned, secret_file: str | None) -> None:
    data = {
        "org_id": result.org_id,
        "app_id": result.app_id,
        "status": result.status,
        "configuration": result.configuration,
    }
    if result.credentials:
        data.update(client_id=result.credentials.client_id, client_secret=result.credentials.client_secret)
        _show_credentials(out, f"Created {kind} {name}.", data, result.credentials, secret_file)
    else:
        out.emit(f"{kind.capitalize()} {name} {result.status}; its credentials are unchanged.", data)


def cmd_org_apply(args, out: Output) -> None:
    spec = _load_spec(args.file, ORG_FIELDS, ("org_id",))
    org_id = spec.pop("org_id")
    result = _provisioning(args).put_org(org_id, spec)
    _report_applied(out, "org", org_id, result, args.secret_file)


def cmd_app_apply(args, out: Output) -> None:
    spec = _load_spec(args.file, APP_FIELDS, ("org_id", "app_id"))
    org_id, app_id = spec.pop("org_id"), spec.pop("app_id")
    result = _provisioning(args).put_app(org_id, app_id, spec)
    _report_applied(out, "app", f"{app_id} (org {org_id})", result, args.secret_file)


def cmd_rotate(args, out: Output) -> None:
    rotation = _provisioning(args).rotate(args.org, args.app, grace_period_hours=args.grace_hours)
    until = rotation.old_secret_expires_at
    data = {
        "org_id": rotation.org_id,
        "app_id": rotation.app_id,
        "client_id": rotation.credentials.client_id,
        "client_secret": rotation.credentials.client_secret,
        "rotation": rotation.raw.get("rotation", {}),
    }
    old = (
        f"The old secret stops working at {until:%Y-%m-%d %H:%M:%S} UTC."
        if until and rotation.grace_period_hours
        else "The old secret no longer works."
    )
    _show_credentials(
        out,
        f"Rotated credentials of {rotation.credentials.client_id}. {old}",
        data,
        rotation.credentials,
        args.secret_file,
    )


def cmd_revoke_tokens(args, out: Output) -> None:
    app_id = getattr(args, "app", None)
    _provisioning(args).revoke_tokens(args.org, app_id)
    client_id = f"org-{args.org}" + (f"-app-{app_id}" if app_id else "")
    out.emit(
        f"Revoked every token issued to {client_id} until now (access tokens end within 30 s). "
        "Its client secret still works; rotate it too if it leaked.",
        {"org_id": args.org, "app_id": app_id, "client_id": client_id, "revoked": True},
    )


def cmd_revoke(args, out: Output) -> None:
    token = sys.stdin.read().strip() if args.token == "-" else args.token
    if not token:
        raise UsageProblem("no token given")
    keeper = _keeper(args)
    try:
        keeper.tokens.revoke(token, args.hint)
    finally:
        keeper.close()
    out.emit("Token revoked.", {"revoked": True})


def cmd_spend(args, out: Output) -> None:
    if args.day != "today" and not _DAY.match(args.day):
        raise UsageProblem(f"day must be 'today' or YYYY-MM-DD, not {args.day!r}")
    keeper = _keeper(args)
    try:
        spend = keeper.daily_spend(args.day)
    finally:
        keeper.close()
    out.emit(render(spend), spend.to_json())


def cmd_model(args, out: Output) -> None:
    keeper = _keeper(args)
    try:
        choice = keeper.select_model(force=args.force)
    finally:
        keeper.close()
    out.emit(
        f"{choice.label} ({choice.bedrock_model_id}) · mode {choice.mode} · reason {choice.reason}"
        f" · ask again in {choice.cache_duration_secs}s",
        choice.raw,
    )


def cmd_reconciliation(args, out: Output) -> None:
    if args.day != "today" and not _DAY.match(args.day):
        raise UsageProblem(f"day must be 'today' or YYYY-MM-DD, not {args.day!r}")
    admin = _provisioning(args)
    try:
        result = admin.reconciliation(None if args.day == "today" else args.day)
    finally:
        admin.close()
    lines = [f"{result['date']} (UTC) in {result['region']}: Bedrock's count vs metered, per model"]
    lines += [
        f"{row['model_id']}: {row['bedrock']['invocations']} calls, {row['metered']['invocations']} metered"
        f" · unmetered {row['unmetered']['input_tokens']} in / {row['unmetered']['output_tokens']} out tokens"
        f" ≈ ${row['unmetered']['estimated_cost_usd_micros'] / 1_000_000:.6f}"
        for row in result["models"]
    ] or ["(no Bedrock calls or metered usage reconciled yet)"]
    out.emit("\n".join(lines), result)


# -- parser ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=url_from_env(), help="service base URL (default: $PRICE_KEEPER_URL or http://127.0.0.1:8080)"
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser = argparse.ArgumentParser(
        prog="price-keeper",
        description="Operate Bedrock Price Keeper.",
        epilog="Exit codes: 1 failure, 2 bad usage, 3 auth, 4 not found, 5 quota.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{org,app,revoke,spend,model,reconciliation}"
    )

    def command(under, name: str, handler, help: str, description: str | None = None) -> argparse.ArgumentParser:
        """A subcommand that takes the common options and runs ``handler``."""
        sub = under.add_parser(name, parents=[common], help=help, description=description)
        sub.set_defaults(handler=handler)
        return sub

    for kind, handler, fields in (("org", cmd_org_apply, ORG_FIELDS), ("app", cmd_app_apply, APP_FIELDS)):
        group = commands.add_parser(kind, help=f"provision {kind}s (needs $PRICE_KEEPER_API_KEY)")
        actions = group.add_subparsers(dest="action", required=True)
        apply = command(
            actions,
            "apply",
            handler,
            f"create or update the {kind} a YAML file describes",
            f"Fields: {', '.join(sorted(fields))}.",
        )
        apply.add_argument("file", help="YAML file")
        apply.add_argument("--secret-file", help="write a new secret to this file (mode 600) instead of printing it")
        rotate = command(actions, "rotate", cmd_rotate, "rotate the client secret")
        rotate.add_argument("--org", required=True, help="org id")
        rotate.add_argument("--app", required=kind == "app", help="app id (rotate the app's secret)")
        rotate.add_argument(
            "--grace-hours",
            type=int,
            required=True,
            help="hours the old secret keeps working (0-168; 0 ends it at once)",
        )
        rotate.add_argument("--secret-file", help="write the new secret to this file (mode 600) instead of printing it")
        revoke_tokens = command(
            actions,
            "revoke-tokens",
            cmd_revoke_tokens,
            f"end every token issued to the {kind}'s client until now",
            "Refresh tokens stop at once, access tokens within 30 s; the client secret keeps working.",
        )
        revoke_tokens.add_argument("--org", required=True, help="org id")
        if kind == "app":
            revoke_tokens.add_argument("--app", required=True, help="app id")

    as_client = "Authenticates with $PRICE_KEEPER_CLIENT_ID/SECRET"
    revoke = command(
        commands, "revoke", cmd_revoke, "revoke an access or refresh token", f"{as_client} (the token's client)."
    )
    revoke.add_argument("token", help="the token, or - to read it from stdin")
    revoke.add_argument("--hint", choices=("access_token", "refresh_token"), help="token type hint")

    spend = command(
        commands,
        "spend",
        cmd_spend,
        "spend vs quota per label for a day",
        f"{as_client}; org and app default to the ones the client id names.",
    )
    spend.add_argument("day", help="today or YYYY-MM-DD (org-local day)")
    spend.add_argument("--org", help="org id")
    spend.add_argument("--app", help="app id (omit for the org's totals with org credentials)")

    model = command(commands, "model", cmd_model, "the model an app should call now", f"{as_client} (an app client).")
    model.add_argument("--org", help="org id")
    model.add_argument("--app", help="app id")
    model.add_argument("--force", action="store_true", help="ask for a real-time quota check")

    reconciliation = command(
        commands,
        "reconciliation",
        cmd_reconciliation,
        "Bedrock's own counts vs metered usage per model (needs $PRICE_KEEPER_API_KEY)",
        "The latest hourly reconciliation of a UTC day: calls and tokens CloudWatch "
        "counted per model, what was metered, and the unmetered remainder at the model's price.",
    )
    reconciliation.add_argument("day", nargs="?", default="today", help="today or YYYY-MM-DD (UTC day)")
    return parser


def _exit_code(error: PriceKeeperError) -> int:
    if isinstance(error, (InvalidRequest, InvalidConfig, InvalidModelLabel)):
        return EXIT_USAGE
    if isinstance(error, (Unauthorized, Forbidden)):
        return EXIT_AUTH
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, QuotaExceeded):
        return EXIT_QUOTA
    return EXIT_OTHER


def _fail(code: int, message: str) -> int:
    print(f"price-keeper: error: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.handler(args, Output(args.json))
    except UsageProblem as problem:
        return _fail(EXIT_USAGE, str(problem))
    except AuthProblem as problem:
        return _fail(EXIT_AUTH, str(problem))
    except ConnectionFailed:
        return _fail(EXIT_OTHER, f"cannot reach {args.url}")
    except PriceKeeperError as error:
        extra = f" (request {error.request_id})" if error.request_id else ""
        detail = ""
        if isinstance(error, QuotaExceeded) and error.retry_after:
            detail = f"; quotas reset at {error.retry_after:%Y-%m-%dT%H:%M:%SZ}"
        return _fail(_exit_code(error), f"{error.code}: {error.message}{detail}{extra}")
    except OSError as error:
        return _fail(EXIT_OTHER, f"{error.filename or ''}: {error.strerror}".lstrip(": "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
