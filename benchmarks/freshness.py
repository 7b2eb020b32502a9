"""How soon a usage report shows in ``GET .../aggregates/today`` on the local stack, with the
aggregator's schedule set to an hour (so only the usage stream can have folded it).

    .venv/bin/python benchmarks/freshness.py [--reports 30] [--poll 0.05]

Starts ``python -m local`` (in memory) as the e2e tests do, provisions an org and an app,
then for each report: ``POST .../usage`` and poll the app's aggregates every ``--poll`` s
until its request count includes it. Prints the time from the report's answer to the first
aggregates answer that shows it: min, median, p95, max. Includes up to one poll interval.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT), str(ROOT / "client")]

from tests.local_server import local_server  # noqa: E402
from tests.tenants import new_tenant  # noqa: E402
from tests.usage_support import usage_body  # noqa: E402

KEY = "bench-provisioning-key"
TARGET_SECONDS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=30)
    parser.add_argument("--poll", type=float, default=0.05)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as logs,
        local_server(Path(logs), KEY, AGGREGATOR_INTERVAL_SECONDS="3600") as base,
    ):
        tenant = new_tenant(base, KEY, ["fresh"], model_ordering=["premium"], quotas={"premium": 10**12})
        session = requests.Session()
        session.headers.update(tenant.bearer("fresh"))
        app = tenant.app_path("fresh")

        def shown() -> int:
            return session.get(f"{app}/aggregates/today", timeout=10).json()["models"]["premium"]["requests"]

        latencies = []
        for reported in range(1, args.reports + 1):
            session.post(f"{app}/usage", json=usage_body(), timeout=10).raise_for_status()
            answered = time.perf_counter()
            while shown() < reported:
                time.sleep(args.poll)
            latencies.append(time.perf_counter() - answered)
    latencies.sort()
    p95 = latencies[max(0, int(len(latencies) * 0.95) - 1)]
    print(
        f"{args.reports} usage reports, schedule every 3600 s, polled every {args.poll:g} s: visible in "
        f"aggregates/today after min {latencies[0]:.2f} s, median {statistics.median(latencies):.2f} s, "
        f"p95 {p95:.2f} s, max {latencies[-1]:.2f} s (target {TARGET_SECONDS} s: "
        f"{'met' if latencies[-1] <= TARGET_SECONDS else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
