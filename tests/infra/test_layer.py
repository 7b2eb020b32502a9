"""The shared layer bundling: Lambda-ready wheels for the chosen architecture, the
package, and config.yaml where config.py looks first; the asset hash follows the inputs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from stacks import REPO_ROOT
from stacks.layer import bundle_layer, layer_hash

pytestmark = pytest.mark.infra

ELF_MACHINE_AARCH64 = 0xB7  # e_machine of an arm64 ELF file (the functions run on arm64)


def _elf_machine(path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    return int.from_bytes(header[18:20], "little")


def test_hash_follows_config_and_is_stable(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_bytes((REPO_ROOT / "config.yaml").read_bytes())
    first = layer_hash(config)
    assert layer_hash(config) == first
    assert layer_hash(REPO_ROOT / "config.yaml") == first  # content, not location
    config.write_text(config.read_text() + "\n# changed\n")
    assert layer_hash(config) != first


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A real bundle (pip downloads about 1 MB of wheels from PyPI)."""
    out = tmp_path_factory.mktemp("layer")
    bundle_layer(out, REPO_ROOT / "config.yaml")
    return out / "python"


def test_native_wheels_are_built_for_arm64(bundle):
    native = list(bundle.rglob("*.so"))
    assert {p.parent.name for p in native} >= {"bcrypt"}
    assert all(_elf_machine(p) == ELF_MACHINE_AARCH64 for p in native)


def test_bundle_has_dependencies_package_and_config_but_no_bytecode(bundle):
    for name in ("jwt", "bcrypt", "yaml"):
        assert (bundle / name / "__init__.py").is_file(), name
    source = REPO_ROOT / "layers" / "common" / "python" / "price_keeper"
    assert sorted(p.name for p in (bundle / "price_keeper").glob("*.py")) == sorted(p.name for p in source.glob("*.py"))
    assert (bundle / "price_keeper" / "config.yaml").read_bytes() == (REPO_ROOT / "config.yaml").read_bytes()
    assert not list(bundle.rglob("__pycache__"))


def test_bundled_package_reads_its_own_config(bundle, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PRICE_KEEPER_CONFIG"}
    env["PYTHONPATH"] = str(bundle)
    result = subprocess.run(
        [sys.executable, "-c", "from price_keeper import config; print(config.config_path())"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(bundle / "price_keeper" / "config.yaml")


def test_bundled_package_imports_where_lambda_mounts_layers(bundle):
    """Lambda mounts layers at /opt/python: the package sits two levels below the root."""
    if not os.access("/", os.W_OK):
        pytest.skip("needs a directory at the filesystem root, as /opt is")
    root = Path(tempfile.mkdtemp(prefix="pk-opt-", dir="/"))
    try:
        shutil.copytree(bundle / "price_keeper", root / "python" / "price_keeper")
        env = {k: v for k, v in os.environ.items() if k != "PRICE_KEEPER_CONFIG"}
        env["PYTHONPATH"] = str(root / "python")
        result = subprocess.run(
            [sys.executable, "-c", "from price_keeper import config; print(config.get_config().service_name)"],
            cwd=root, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "bedrock-price-keeper"
    finally:
        shutil.rmtree(root)
