"""The shared layer bundling: Lambda-ready wheels for the chosen architecture, the
package, the config as JSON where config.py looks first, byte code for the runtime's
Python; the asset hash follows the inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from price_keeper.config import read_raw
from stacks import REPO_ROOT
from stacks.layer import _package_files, bundle_layer, layer_hash, runtime_python
from stacks.settings import PYTHON_VERSION

pytestmark = pytest.mark.infra

ELF_MACHINE_AARCH64 = 0xB7  # e_machine of an arm64 ELF file (the functions run on arm64)


def _elf_machine(path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    return int.from_bytes(header[18:20], "little")


def run_python(code: str, python_path: Path, *, cwd: Path | None = None, python: str = sys.executable, **env) -> str:
    """What ``python -c code`` prints with ``python_path`` as its PYTHONPATH (and no
    PRICE_KEEPER_CONFIG, as in Lambda); ``env`` adds variables."""
    environment = {k: v for k, v in os.environ.items() if k != "PRICE_KEEPER_CONFIG"}
    environment.update(PYTHONPATH=str(python_path), **env)
    result = subprocess.run([python, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


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


def test_bundle_has_dependencies_package_and_config_as_json(bundle):
    for name in ("jwt", "bcrypt"):
        assert (bundle / name / "__init__.py").is_file(), name
    assert not (bundle / "yaml").exists()  # the layer reads JSON; no YAML parser in a cold start
    source = REPO_ROOT / "layers" / "common" / "python" / "price_keeper"
    assert sorted(p.name for p in (bundle / "price_keeper").glob("*.py")) == sorted(p.name for p in source.glob("*.py"))
    bundled = json.loads((bundle / "price_keeper" / "config.json").read_text())
    assert bundled == read_raw(REPO_ROOT / "config.yaml")
    assert not (bundle / "price_keeper" / "config.yaml").exists()


def test_bundle_ships_the_console_page_and_the_hash_covers_it(bundle):
    """GET /console is package data of the layer (price_keeper/http/console/): shipped, and loadable there."""
    source = REPO_ROOT / "layers" / "common" / "python" / "price_keeper" / "http" / "console"
    files = sorted(p.name for p in source.iterdir() if p.is_file())
    assert {"console.html", "console.css", "console.js"} <= set(files)
    assert sorted(p.name for p in (bundle / "price_keeper" / "http" / "console").iterdir() if p.is_file()) == files
    assert {source / name for name in files} <= set(_package_files())  # a page change redeploys the layer
    printed = run_python("from price_keeper.http import console; print(console.page().html[:15])", bundle)
    assert printed.strip() == "<!doctype html>"


@pytest.mark.skipif(runtime_python() is None, reason=f"no Python {PYTHON_VERSION} on this machine to precompile with")
def test_every_module_is_precompiled_for_the_runtime(bundle):
    tag = f"cpython-{PYTHON_VERSION.replace('.', '')}"
    sources = [p for p in bundle.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(sources) > 30
    for source in sources:
        compiled = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        assert compiled.is_file(), source
        flags = int.from_bytes(compiled.read_bytes()[4:8], "little")
        assert flags == 0b01, source  # hash-based, unchecked: valid whatever the zip's timestamps


def test_bundled_package_reads_its_own_config(bundle, tmp_path):
    printed = run_python(
        "import sys; from price_keeper import config; config.get_config();"
        "print(config.config_path(), 'yaml' in sys.modules)",
        bundle,
        cwd=tmp_path,
    )
    assert printed.split() == [str(bundle / "price_keeper" / "config.json"), "False"]


def test_bundled_package_imports_where_lambda_mounts_layers(bundle):
    """Lambda mounts layers at /opt/python: the package sits two levels below the root."""
    if not os.access("/", os.W_OK):
        pytest.skip("needs a directory at the filesystem root, as /opt is")
    root = Path(tempfile.mkdtemp(prefix="pk-opt-", dir="/"))
    try:
        shutil.copytree(bundle / "price_keeper", root / "python" / "price_keeper")
        printed = run_python(  # with the runtime's Python where there is one: its byte code loads
            "from price_keeper import config; print(config.get_config().service_name)",
            root / "python",
            cwd=root,
            python=runtime_python() or sys.executable,
        )
        assert printed.strip() == "bedrock-price-keeper"
    finally:
        shutil.rmtree(root)


def test_bundle_ships_the_time_zone_database(bundle, tmp_path):
    """Orgs' days begin at their own midnight (timeutil, zoneinfo): the layer brings tzdata, so
    no runtime image without /usr/share/zoneinfo can fail an org's time zone."""
    printed = run_python(
        "import zoneinfo; print(zoneinfo.ZoneInfo('America/New_York').key)",
        bundle,
        cwd=tmp_path,
        PYTHONTZPATH=str(tmp_path),  # no system database
    )
    assert printed.strip() == "America/New_York"
