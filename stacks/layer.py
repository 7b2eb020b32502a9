"""The shared layer (``price_keeper`` + its pip dependencies + the config as JSON), built
without Docker and precompiled for the runtime's Python, and the AWS-managed Powertools layer."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import jsii
from aws_cdk import (
    Annotations,
    AssetHashType,
    BundlingOptions,
    ILocalBundling,
    RemovalPolicy,
    Stack,
)
from aws_cdk import (
    aws_lambda as lambda_,
)
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from price_keeper.config import BUNDLED_NAME, read_raw

from . import LAYER_DIR, LAYER_SOURCE, REPO_ROOT
from .settings import ARCHITECTURE, PIP_PLATFORM, POWERTOOLS_ARCH, PYTHON_VERSION, RUNTIME, Settings

PACKAGE = "price_keeper"
REQUIREMENTS = LAYER_DIR / "requirements.txt"
_SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc")


def _package_files() -> list[Path]:
    return sorted(
        p
        for p in (LAYER_SOURCE / PACKAGE).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def layer_hash(config_path: Path) -> str:
    """Hash of everything that decides the layer's content (so a config change, or a build
    machine that can now precompile it, redeploys it)."""
    precompiled = runtime_python() is not None
    digest = hashlib.sha256(f"{PIP_PLATFORM}|{PYTHON_VERSION}|{precompiled}".encode())
    named = [("requirements.txt", REQUIREMENTS), ("config.yaml", config_path)]
    named += [(path.relative_to(LAYER_SOURCE).as_posix(), path) for path in _package_files()]
    for name, path in named:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def runtime_python() -> str | None:
    """An interpreter of the functions' Python version (``LAYER_PYTHON``, ``python3.12`` on
    the PATH, or a pyenv install), or ``None`` when this machine has none. Probed once per
    process: a synth asks twice (the asset hash, then the bundling)."""
    candidates = [
        os.environ.get("LAYER_PYTHON"),
        sys.executable,
        shutil.which(f"python{PYTHON_VERSION}"),
        *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{PYTHON_VERSION}.*/bin/python3"))),
    ]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == PYTHON_VERSION:
            return candidate
    return None


def bundle_layer(output_dir: Path, config_path: Path, pip_platform: str = PIP_PLATFORM) -> bool:
    """Lay out ``output_dir/python``: Lambda-ready wheels of the layer's requirements, the
    ``price_keeper`` package, and the config as ``config.json`` beside it (config.py looks
    there first). True when the layer was precompiled. ``pip_platform`` other than the
    functions' own is for measuring the layer on this machine (benchmarks/cold_start.py).

    Lambda's /opt is read-only, so modules shipped without byte code are compiled again on
    every cold start (about 30 ms for this layer). With an interpreter of the runtime's
    version at hand, the bundle gets ``unchecked-hash`` .pyc files, which stay valid whatever
    timestamps the zip gives the sources; without one it ships sources only.
    """
    target = output_dir / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--platform",
            pip_platform,
            "--only-binary=:all:",
            "--python-version",
            PYTHON_VERSION,
            "--implementation",
            "cp",
            "--target",
            str(target),
            "-r",
            str(REQUIREMENTS),
        ],
        check=True,
        stdout=sys.stderr,
    )
    shutil.copytree(LAYER_SOURCE / PACKAGE, target / PACKAGE, ignore=_SKIPPED, dirs_exist_ok=True)
    (target / PACKAGE / BUNDLED_NAME).write_text(json.dumps(read_raw(config_path)), encoding="utf-8")
    interpreter = runtime_python()
    if interpreter is None:
        print(
            f"warning: no Python {PYTHON_VERSION} found (set LAYER_PYTHON): the layer ships without byte code",
            file=sys.stderr,
        )
        return False
    subprocess.run(
        [interpreter, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash", str(target)],
        check=True,
        stdout=sys.stderr,
    )
    return True


@jsii.implements(ILocalBundling)
class PipLayerBundling:
    """Local bundling of the shared layer: pip's cross-platform wheel install, no Docker."""

    def __init__(self, config_path: Path):
        self.config_path = config_path

    def try_bundle(self, output_dir: str, options: BundlingOptions) -> bool:  # noqa: ARG002 (jsii passes both)
        bundle_layer(Path(output_dir), self.config_path)
        return True


class SharedLayers(Construct):
    """``self.common``: our layer; ``self.powertools``: the AWS-managed Powertools layer
    (Powertools, pydantic and the X-Ray SDK, built for this runtime and architecture)."""

    def __init__(self, scope: Construct, id: str, settings: Settings):
        super().__init__(scope, id)
        if settings.bundle_layer:
            code = lambda_.Code.from_asset(
                str(LAYER_DIR),
                asset_hash_type=AssetHashType.CUSTOM,
                asset_hash=layer_hash(settings.config_path),
                bundling=BundlingOptions(
                    image=RUNTIME.bundling_image,  # required by the API; local bundling never falls back
                    local=PipLayerBundling(settings.config_path),
                ),
            )
        else:
            code = lambda_.Code.from_asset(str(LAYER_DIR), exclude=["**/__pycache__", "*.pyc"])
            Annotations.of(self).add_warning_v2(
                "price-keeper:unbundledLayer",
                "bundleLayer=false: the shared layer has no dependencies and no config; do not deploy this",
            )
        self.common = lambda_.LayerVersion(
            self,
            "Common",
            code=code,
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="Bedrock Price Keeper shared code (price_keeper, pyjwt, bcrypt, config)",
            removal_policy=RemovalPolicy.DESTROY,
        )
        if settings.powertools_layer_version is None:
            # The layer of the version the tests run: AWS publishes its ARN in every region as a
            # public SSM parameter, resolved at deploy (a bump of the pin moves the layer).
            arn = ssm.StringParameter.value_for_string_parameter(self, powertools_parameter())
        else:
            stack = Stack.of(self)
            arn = (
                f"arn:{stack.partition}:lambda:{stack.region}:{POWERTOOLS_ACCOUNT}:layer:"
                f"AWSLambdaPowertoolsPythonV3-python{PYTHON_VERSION.replace('.', '')}-{POWERTOOLS_ARCH}:"
                f"{settings.powertools_layer_version}"
            )
        self.powertools = lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", arn)


POWERTOOLS_ACCOUNT = "017000801446"  # the AWS account that publishes the Powertools layers


def pinned_powertools() -> str:
    """The Powertools version ``requirements.txt`` pins: the one the tests run."""
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        name, pinned, version = line.split("#")[0].partition("==")
        if pinned and name.split("[")[0].strip() == "aws-lambda-powertools":
            return version.strip()
    raise ValueError("requirements.txt pins no aws-lambda-powertools")


def powertools_parameter() -> str:
    """AWS's public SSM parameter holding the layer ARN of the pinned version."""
    return f"/aws/service/powertools/python/{POWERTOOLS_ARCH}/python{PYTHON_VERSION}/{pinned_powertools()}"
