"""Schemathesis against the served OpenAPI document of the local server: every operation,
positive and negative data, no 5xx and every response within its documented schema.

Two passes: one with the path ids pinned to a provisioned org and app and a real bearer
token, so the authenticated handlers run past ``pipeline.admit``; one with generated ids,
so id validation and tenant checks see hostile paths. The credential operations (rotation,
revoke-tokens) end the tokens they concern, so they get the same two passes last, with the
provisioning key only."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_server import local_server
from tests.tenants import new_tenant

KEY = "fuzz-provisioning-key"
ST = Path(sys.executable).parent / "st"
CHECKS = "not_a_server_error,response_schema_conformance"

pytestmark = pytest.mark.e2e


def provisioned_tenant(base: str) -> tuple[str, str, str]:
    """(org_id, app_id, org access token) of an org and app created over the API; an org
    token may act on the org and on every app in it."""
    tenant = new_tenant(base, KEY, ["fuzz-app"], org_name="fuzz", timezone="America/New_York")
    return tenant.org_id, "fuzz-app", tenant.tokens()["access_token"]


def schemathesis_run(
    base: str,
    tmp_path: Path,
    name: str,
    max_examples: int,
    headers: dict,
    path_ids: dict | None = None,
    operations: tuple[str, ...] = (),
) -> None:
    """One ``st run``; headers go in the config file (a CLI ``-H`` would replace them all)."""
    config = "headers = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items()) + " }\n"
    if path_ids:
        config += "[parameters]\n" + "".join(f'"path.{k}" = {json.dumps(v)}\n' for k, v in path_ids.items())
    config_file = tmp_path / f"{name}.toml"
    config_file.write_text(config)
    result = subprocess.run(
        [
            str(ST),
            "--config-file",
            str(config_file),
            "--no-color",
            "run",
            f"{base}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(max_examples),
            "--seed",
            "20261122",
            *operations,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{name}:\n" + result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "Authentication failed" not in result.stdout, f"{name}: the token did not authenticate"


# Rotation and revoke-tokens end the client's tokens (schemathesis finds the provisioned org
# through its responses even when it generates ids), so they run in passes of their own,
# with the provisioning key only, after the passes that need the bearer token.
CREDENTIALS = "/credentials/"


@pytest.mark.slow
def test_no_server_error_and_no_schema_violation(tmp_path):
    with local_server(tmp_path, KEY) as base:
        org_id, app_id, token = provisioned_tenant(base)
        headers = {"X-API-Key": KEY, "Authorization": f"Bearer {token}"}
        without_credentials = ("--exclude-path-regex", CREDENTIALS)
        schemathesis_run(
            base, tmp_path, "authenticated", 15, headers, {"org_id": org_id, "app_id": app_id}, without_credentials
        )
        schemathesis_run(base, tmp_path, "generated_ids", 5, headers, operations=without_credentials)
        only_credentials = ("--include-path-regex", CREDENTIALS)
        schemathesis_run(
            base,
            tmp_path,
            "credentials",
            15,
            {"X-API-Key": KEY},
            {"org_id": org_id, "app_id": app_id},
            only_credentials,
        )
        schemathesis_run(
            base, tmp_path, "credentials_generated_ids", 5, {"X-API-Key": KEY}, operations=only_credentials
        )
