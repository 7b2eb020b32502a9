"""Schemathesis against the served OpenAPI document of the local server: every operation,
positive and negative data, no 5xx and every response within its documented schema."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_server import local_server

KEY = "fuzz-provisioning-key"
ST = Path(sys.executable).parent / "st"

pytestmark = pytest.mark.e2e


def test_no_server_error_and_no_schema_violation(tmp_path):
    with local_server(tmp_path, KEY) as base:
        result = subprocess.run(
            [str(ST), "run", f"{base}/openapi.json", "--checks", "not_a_server_error,response_schema_conformance",
             "--max-examples", "10", "--seed", "20261122", "-H", f"X-API-Key: {KEY}", "--no-color"],
            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
