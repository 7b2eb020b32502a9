"""Cold-start import time of every function, measured the way Lambda runs them.

    .venv/bin/python benchmarks/cold_start.py [--runs 9]
    .venv/bin/python benchmarks/cold_start.py --instructions [FUNCTION ...]   # valgrind counts

The functions' environment is rebuilt here (the venv is cached under ``.bench/``):

- a venv of the runtime's Python (``stacks.layer.runtime_python()``, 3.12) holding
  ``requirements.txt``: what the Lambda runtime (boto3) and the AWS Powertools layer
  (Powertools, pydantic, the X-Ray SDK) provide;
- the shared layer exactly as ``stacks.layer.bundle_layer`` builds it (config as JSON,
  precompiled byte code), with wheels for this machine's CPU instead of arm64;
- ``LAMBDA_TASK_ROOT`` set (the X-Ray SDK then builds no sampling client, as in Lambda),
  tracing on, byte-code writes off (Lambda's /opt and /var/task are read-only).

Each function's handler module is imported in a fresh interpreter ``--runs`` times (round
robin over all functions); the time printed is the import alone (interpreter start-up
excluded), min and median. The peer in the same run is the *library floor*: importing
only the libraries every HTTP function needs (boto3, Powertools Event Handler with validation, Logger/Metrics/Tracer,
Parameters, pyjwt, bcrypt). "ours" is a handler's min minus the floor's min: what the
service's own code adds. Timings on a shared machine are noisy; ``--instructions`` counts
instructions instead (valgrind), which repeat exactly from run to run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")  # stacks.layer loads the CDK
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT)]

from price_keeper import routes  # noqa: E402
from stacks.layer import bundle_layer, runtime_python  # noqa: E402

BENCH_DIR = ROOT / ".bench"
FUNCTIONS = (*routes.HTTP_FUNCTIONS, *routes.JOBS)
TIMED = "import time; started = time.perf_counter()\n{body}\nprint((time.perf_counter() - started) * 1000)"
FLOOR = """import boto3, bcrypt, jwt
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.utilities import parameters
APIGatewayRestResolver(enable_validation=True)
Logger(); Metrics(namespace="floor"); Tracer(patch_modules=("botocore",))"""


def runtime_venv() -> Path:
    """A venv of the runtime's Python with requirements.txt, reused while that file stays the same."""
    interpreter = runtime_python()
    if interpreter is None:
        sys.exit("no Python of the functions' version on this machine (set LAYER_PYTHON)")
    digest = hashlib.sha256((ROOT / "requirements.txt").read_bytes() + interpreter.encode()).hexdigest()[:12]
    venv = BENCH_DIR / f"runtime-{digest}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                str(ROOT / "requirements.txt"),
            ],
            check=True,
        )
    return python


def lambda_environment(layer: Path) -> dict:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("POWERTOOLS_", "AWS_", "PYTHON", "LAMBDA_"))
    }
    env.update(
        PYTHONPATH=str(layer),
        PYTHONDONTWRITEBYTECODE="1",
        LAMBDA_TASK_ROOT=str(ROOT / "lambdas"),
        AWS_LAMBDA_FUNCTION_NAME="cold-start-bench",
        AWS_REGION="us-east-1",
        POWERTOOLS_SERVICE_NAME="price-keeper",
    )
    return env


@contextmanager
def lambda_like():
    """(python, env): the runtime venv and an environment over a freshly bundled layer."""
    python = runtime_venv()
    with tempfile.TemporaryDirectory() as out:
        if not bundle_layer(Path(out), ROOT / "config.yaml", pip_platform=f"manylinux2014_{platform.machine()}"):
            sys.exit("the layer could not be precompiled")
        yield python, lambda_environment(Path(out) / "python")


def timed_run(python: Path, env: dict, body: str) -> float:
    code = TIMED.format(body=body)
    return float(
        subprocess.run(
            [str(python), "-c", code], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True
        ).stdout
    )


def instructions(python: Path, env: dict, body: str) -> int:
    """Instructions executed by ``body`` beyond a bare interpreter start, counted by
    ``valgrind --tool=callgrind``: the same on every run however busy the machine is."""

    def count(code: str) -> int:
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(python), "-c", code],
            env={**env, "PYTHONHASHSEED": "0"},
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            check=True,
        )
        return int(re.search(r"Collected : (\d+)", result.stderr).group(1))

    return count(body) - count("pass")


def handler_import(function: str) -> str:
    path = str(ROOT / "lambdas" / function / "handler.py")
    return (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('handler', {path!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))"
    )


def heaviest_packages(python: Path, env: dict, function: str, runs: int = 3, top: int = 6) -> list[tuple[str, float]]:
    """Self import time by top-level package (``-X importtime``, each module's best of
    ``runs``), for the docs' breakdown."""
    best: dict[str, int] = {}
    for _ in range(runs):
        result = subprocess.run(
            [str(python), "-X", "importtime", "-c", handler_import(function)],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            check=True,
        )
        for line in result.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0].split(":")[-1].strip().isdigit():
                module, micros = parts[2].strip(), int(parts[0].split(":")[-1])
                best[module] = min(best.get(module, micros), micros)
    by_package: Counter = Counter()
    for module, micros in best.items():
        by_package[module.split(".")[0]] += micros
    return [(name, micros / 1000) for name, micros in by_package.most_common(top)]


def measure_instructions(functions) -> dict[str, int]:
    """Instructions of the library floor and of each function's handler import (~15 s each)."""
    with lambda_like() as (python, env):
        return {
            "library floor": instructions(python, env, FLOOR),
            **{function: instructions(python, env, handler_import(function)) for function in functions},
        }


def measure(runs: int) -> tuple[dict[str, tuple[float, float]], list[tuple[str, float]]]:
    """(min, median) ms of the library floor and of every function's handler import, and the
    heaviest packages of the slowest handler."""
    with lambda_like() as (python, env):
        targets = {"library floor": FLOOR, **{function: handler_import(function) for function in FUNCTIONS}}
        results: dict[str, list[float]] = {name: [] for name in targets}
        for _ in range(runs):  # round-robin, so a noisy moment hits every target alike
            for name, body in targets.items():
                results[name].append(timed_run(python, env, body))
        heaviest = heaviest_packages(python, env, max(results, key=lambda name: min(results[name])))
    return {name: (min(times), statistics.median(times)) for name, times in results.items()}, heaviest


def print_times(results: dict[str, tuple[float, float]], heaviest: list[tuple[str, float]], runs: int) -> None:
    floor = results["library floor"][0]
    print(f"Cold-start imports, Lambda-like (runtime Python, bundled layer, tracing on), {runs} runs each")
    print(f"  {'function':20s} {'min ms':>8s} {'median ms':>10s} {'ours ms':>8s}")
    for name, (best, median) in results.items():
        ours = "" if name == "library floor" else f"{best - floor:8.1f}"
        print(f"  {name:20s} {best:8.1f} {median:10.1f} {ours}")
    print(
        "  slowest handler's heaviest packages (self time, ms): "
        + ", ".join(f"{name} {ms:.0f}" for name, ms in heaviest)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--instructions",
        nargs="*",
        metavar="FUNCTION",
        help="count instructions with valgrind instead of timing (noise-free; ~15 s per "
        "function): the named functions, or all",
    )
    args = parser.parse_args()
    if args.instructions is not None:
        counts = measure_instructions(args.instructions or FUNCTIONS)
        floor = counts["library floor"]
        print("Cold-start imports, Lambda-like, instructions beyond interpreter start-up (valgrind callgrind)")
        for name, count in counts.items():
            print(
                f"  {name:20s} {count / 1e6:9.1f} M"
                + ("" if name == "library floor" else f"   ours {100 * (count - floor) / floor:+6.1f} %")
            )
        return
    print_times(*measure(args.runs), args.runs)


if __name__ == "__main__":
    main()
