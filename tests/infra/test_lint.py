"""cfn-lint on the synthesized templates, with the repository's .cfnlintrc (W3005 off)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stacks import REPO_ROOT

pytestmark = pytest.mark.infra


@pytest.mark.parametrize("variant", ["synth", "synth_options"])
def test_cfn_lint_is_clean(variant, request, tmp_path):
    template = tmp_path / "template.json"
    template.write_text(json.dumps(request.getfixturevalue(variant).json))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--", str(template)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
