"""Latency, throughput, cold-start imports, DynamoDB units and projected AWS cost, in one run.

    .venv/bin/python benchmarks/performance.py [--requests 200] [--threads 4] [--runs 9]

1. Cold-start import time of each function as Lambda runs it, beside the import of the
   required libraries alone (``benchmarks/cold_start.py``).
2. Requests/second and p50/p99 latency of usage submission (single and batches of 100) and
   model selection against the local server (``python -m local``, in-memory) under
   concurrent load on loopback.
3. DynamoDB calls and capacity units per warm request, all-in: through the real handlers
   with one token and rate limits on, token checks and rate-limit leases amortised
   (``benchmarks/dynamodb_costs.py``'s meter, on moto); and the aggregator's stream folds,
   so that the write units per usage record include what its aggregation costs.
4. Projected monthly cost at 10 requests/second from those units, beside the schema
   seed's own estimate, and the all-in cost per 1 M metered calls of a client that batches
   its reports. Prices: us-east-1 on-demand list prices (see PRICES).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT), str(ROOT / "client")]

import cold_start  # noqa: E402

from tests import usage_support  # noqa: E402
from tests.local_server import local_server  # noqa: E402
from tests.tenants import new_tenant  # noqa: E402

KEY = "bench-provisioning-key"
PRICES = {  # USD, us-east-1 on-demand list prices (DynamoDB on-demand since 1 November 2024)
    "dynamodb_per_million_wru": 0.625,
    "dynamodb_per_million_rru": 0.125,
    "lambda_per_million_requests": 0.20,
    "lambda_per_gb_second_arm64": 0.0000133334,
    "api_gateway_rest_per_million": 3.50,
}
SEED_ESTIMATE_DYNAMODB_USD = 8.77  # seed 000 "with revocation check caching"
LAMBDA_MEMORY_GB = 0.256
AGGREGATOR_MEMORY_GB = 1.024  # stacks/functions.py SIZING
UNIT_REQUESTS = 100  # per endpoint, under model selection's 120/minute rate limit
BATCH_REQUESTS = 10  # usage batches of 100 records under load
# The batching client of the per-million projection: 10 calls/s, its reports in batches of 100
# (one every 10 s, folded in one stream batch), model selection as the service's cache
# guidance says (every 300 s in normal mode).
CLIENT_CALLS_PER_SECOND = 10
SELECTION_EVERY_SECONDS = 300


def usage_body() -> dict:
    return usage_support.usage_body(input_tokens=1000, output_tokens=500)


def batch_body() -> dict:
    return {"requests": [usage_body() for _ in range(100)]}


def load(base: str, method: str, path: str, make_body, headers: dict, count: int, threads: int):
    def one(_):
        started = time.perf_counter()
        reply = requests.request(
            method, base + path, json=make_body() if make_body else None, headers=headers, timeout=30
        )
        assert reply.status_code < 300, reply.text
        return time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        latencies = sorted(pool.map(one, range(count)))
    elapsed = time.perf_counter() - started
    return count / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000


def measured_units(requests: int) -> tuple[dict[str, dict], dict[int, dict]]:
    """Calls, write and read units per warm usage submission, usage batch of 100 and model
    selection, through the handlers (token checks and rate-limit leases included), on a
    busy day; and the aggregator's per stream batch, by the usage records in the batch.

    Imported here, not at the top: dynamodb_costs configures a moto environment on import."""
    import dynamodb_costs
    from moto import mock_aws

    from local import moto_patches
    from price_keeper import state

    moto_patches.apply()
    with mock_aws():
        state.reset()
        dynamodb_costs.create_tables()
        meter = dynamodb_costs.Meter()
        measured = dynamodb_costs.through_handlers(meter, requests)
        _, *batches, _ = dynamodb_costs.stream_folds(meter, FOLD_SIZES)  # without the container's first and a replay
    units = {
        request: dict(zip(("by_operation", "calls", "wru", "rru"), row, strict=True))
        for request, row in measured.items()
    }
    folds = {
        size: {"by_operation": calls, "wru": wru, "rru": rru}
        for size, (_, calls, wru, rru) in zip(FOLD_SIZES, batches, strict=True)
    }
    return units, folds


FOLD_SIZES = (1, 5, 100)  # usage records per stream batch (one label of one scope)
HEARTBEAT_WRU_PER_FOLD = 0.1  # one ~80 B put at most every 10 s per container: at one fold a second


def wru_per_record(units: dict, folds: dict) -> list[tuple[str, float]]:
    """All-in write units per usage record: the usage request's, plus its share of the fold
    of its stream batch and of the heartbeat."""
    rows = [
        (
            f"single reports, {size} per stream batch",
            units["usage"]["wru"] + (folds[size]["wru"] + HEARTBEAT_WRU_PER_FOLD) / size,
        )
        for size in FOLD_SIZES
    ]
    rows.append(
        (
            "batches of 100, one stream batch each",
            units["usage_batch"]["wru"] / 100 + (folds[100]["wru"] + HEARTBEAT_WRU_PER_FOLD) / 100,
        )
    )
    return rows


def monthly_cost(p50_ms: dict, units: dict, folds: dict) -> list[tuple[str, float]]:
    per_month = 10 * 86400 * 30  # requests at 10/s, half usage reports, half selections
    reports = per_month / 2  # at 5 a second: 5 records per stream batch
    rows = []
    aggregator = {"wru": folds[5]["wru"] / 5, "rru": folds[5]["rru"] / 5}
    dynamodb = sum(
        per_month
        / 2
        / 1e6
        * (u["wru"] * PRICES["dynamodb_per_million_wru"] + u["rru"] * PRICES["dynamodb_per_million_rru"])
        for u in (units["usage"], units["model_selection"], aggregator)
    )
    rows.append(("DynamoDB (measured units, aggregator included)", dynamodb))
    gb_seconds = sum(per_month / 2 * p50_ms[name] / 1000 * LAMBDA_MEMORY_GB for name in ("usage", "model_selection"))
    folds_per_month = reports / 5
    gb_seconds += folds_per_month * p50_ms["fold"] / 1000 * AGGREGATOR_MEMORY_GB
    rows.append(
        (
            "Lambda (requests + GB-s at local p50)",
            (per_month + folds_per_month) / 1e6 * PRICES["lambda_per_million_requests"]
            + gb_seconds * PRICES["lambda_per_gb_second_arm64"],
        )
    )
    rows.append(("API Gateway REST", per_month / 1e6 * PRICES["api_gateway_rest_per_million"]))
    rows.append(("total", sum(cost for _, cost in rows)))
    rows.append(("seed 000 estimate, DynamoDB only", SEED_ESTIMATE_DYNAMODB_USD))
    return rows


def batching_client_cost(p50_ms: dict, units: dict, folds: dict) -> list[tuple[str, float]]:
    """USD per 1 M metered calls of the batching client (CLIENT_CALLS_PER_SECOND, reports in
    batches of 100, each folded in one stream batch, selection as the cache guidance says)."""
    calls = 1e6
    batches = calls / 100
    selections = calls / CLIENT_CALLS_PER_SECOND / SELECTION_EVERY_SECONDS
    wru = batches * (units["usage_batch"]["wru"] + folds[100]["wru"]) + selections * units["model_selection"]["wru"]
    rru = batches * (units["usage_batch"]["rru"] + folds[100]["rru"]) + selections * units["model_selection"]["rru"]
    rows = [("DynamoDB", (wru * PRICES["dynamodb_per_million_wru"] + rru * PRICES["dynamodb_per_million_rru"]) / 1e6)]
    gb_seconds = (
        batches * p50_ms["usage_batch"] / 1000 * LAMBDA_MEMORY_GB
        + selections * p50_ms["model_selection"] / 1000 * LAMBDA_MEMORY_GB
        + batches * p50_ms["fold_100"] / 1000 * AGGREGATOR_MEMORY_GB
    )
    rows.append(
        (
            "Lambda (requests + GB-s at local p50)",
            (2 * batches + selections) / 1e6 * PRICES["lambda_per_million_requests"]
            + gb_seconds * PRICES["lambda_per_gb_second_arm64"],
        )
    )
    rows.append(("API Gateway REST", (batches + selections) / 1e6 * PRICES["api_gateway_rest_per_million"]))
    rows.append(("total", sum(cost for _, cost in rows)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--runs", type=int, default=9, help="fresh interpreters per cold-start import")
    args = parser.parse_args()

    cold_start.print_times(*cold_start.measure(args.runs), args.runs)

    with tempfile.TemporaryDirectory() as logs, local_server(Path(logs), KEY) as base:
        big = {"premium": 10**12, "standard": 10**12, "economy": 10**12}
        tenant = new_tenant(base, KEY, ["bench"], quotas=big)
        headers = tenant.bearer("bench")
        app = tenant.app_path("bench").removeprefix(base)

        print(
            f"\nLocal server (loopback, moto): {args.requests} requests on {args.threads} threads; "
            f"{BATCH_REQUESTS} batches of 100 on 1"
        )
        p50 = {}
        for name, method, path, body, count, threads in (
            ("usage", "POST", f"{app}/usage", usage_body, args.requests, args.threads),
            ("model_selection", "GET", f"{app}/model-selection", None, args.requests, args.threads),
            ("usage_batch", "POST", f"{app}/usage/batch", batch_body, BATCH_REQUESTS, 1),
        ):
            rps, p50[name], p99 = load(base, method, path, body, headers, count, threads)
            print(f"  {name:16s} {rps:7.1f} req/s   p50 {p50[name]:7.1f} ms   p99 {p99:7.1f} ms")

    units, folds = measured_units(UNIT_REQUESTS)
    print(
        f"\nDynamoDB per warm request, all-in ({UNIT_REQUESTS} requests through the handlers, one token, "
        "rate limits on; moto, units computed from item sizes)"
    )
    for name, measured in units.items():
        print(
            f"  {name:16s} {measured['calls']:.3f} calls ({measured['by_operation']})  "
            f"{measured['wru']:g} WRU  {measured['rru']:g} RRU"
        )
    print("\nThe aggregator per stream batch (fold and alerts; + 1 WRU heartbeat at most every 10 s per container)")
    for size, measured in folds.items():
        print(f"  {size:3d} records  {measured['by_operation']}  {measured['wru']:g} WRU  {measured['rru']:g} RRU")
    # Lambda time of a fold: its DynamoDB calls are sequential, ~10 ms each in a region (moto's are not a guide).
    for size, measured in folds.items():
        p50["fold" if size == 5 else f"fold_{size}"] = 10 * sum(
            int(part.split()[0]) for part in measured["by_operation"].split(", ")
        )

    print("\nWrite units per usage record, all-in (the request, its share of the fold and heartbeat)")
    for name, wru in wru_per_record(units, folds):
        print(f"  {name:40s} {wru:6.3f} WRU")

    print("\nProjected monthly cost at 10 req/s (USD)")
    for name, cost in monthly_cost(p50, units, folds):
        print(f"  {name:48s} {cost:8.2f}")
    print(
        f"\nAll-in AWS cost per 1 M metered calls, batching client ({CLIENT_CALLS_PER_SECOND} calls/s, reports in "
        f"batches of 100, selection every {SELECTION_EVERY_SECONDS} s) (USD)"
    )
    for name, cost in batching_client_cost(p50, units, folds):
        print(f"  {name:48s} {cost:8.3f}")


if __name__ == "__main__":
    main()
