"""Latency, throughput, cold-start imports, DynamoDB units and projected monthly AWS cost,
in one run.

    .venv/bin/python benchmarks/performance.py [--requests 200] [--threads 4] [--runs 9]

1. Cold-start import time of each function as Lambda runs it, beside the import of the
   required libraries alone (``benchmarks/cold_start.py``).
2. Requests/second and p50/p99 latency of usage submission and model selection against
   the local server (``python -m local``, in-memory) under concurrent load on loopback.
3. DynamoDB calls and capacity units per warm request, all-in: through the real handlers
   with one token and rate limits on, token checks and rate-limit leases amortised
   (``benchmarks/dynamodb_costs.py``'s meter, on moto).
4. Projected monthly cost at 10 requests/second from those units, beside the schema
   seed's own estimate. Prices: us-east-1 on-demand list prices (see PRICES).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT)]

import cold_start  # noqa: E402
from tests.local_server import local_server  # noqa: E402

KEY = "bench-provisioning-key"
PRICES = {  # USD, us-east-1 on-demand list prices
    "dynamodb_per_million_wru": 1.25, "dynamodb_per_million_rru": 0.25,
    "lambda_per_million_requests": 0.20, "lambda_per_gb_second_arm64": 0.0000133334,
    "api_gateway_rest_per_million": 3.50,
}
SEED_ESTIMATE_DYNAMODB_USD = 8.77  # seed 000 "with revocation check caching"
LAMBDA_MEMORY_GB = 0.256
UNIT_REQUESTS = 100  # per endpoint, under model selection's 120/minute rate limit


def load(base: str, method: str, path: str, make_body, headers: dict, count: int, threads: int):
    def one(_):
        started = time.perf_counter()
        reply = requests.request(method, base + path, json=make_body() if make_body else None, headers=headers,
                                 timeout=30)
        assert reply.status_code < 300, reply.text
        return time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        latencies = sorted(pool.map(one, range(count)))
    elapsed = time.perf_counter() - started
    return count / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000


def measured_units(requests: int) -> dict[str, dict]:
    """Calls, write and read units per warm usage submission and model selection, through
    the handlers (token checks and rate-limit leases included), on a busy day.

    Imported here, not at the top: dynamodb_costs configures a moto environment on import."""
    import dynamodb_costs
    from moto import mock_aws

    from price_keeper import state
    from tests.moto_support import serialized_moto

    with mock_aws(), serialized_moto():
        state.reset()
        dynamodb_costs.create_tables()
        measured = dynamodb_costs.through_handlers(dynamodb_costs.Meter(), requests)
    return {request: dict(zip(("by_operation", "calls", "wru", "rru"), row)) for request, row in measured.items()}


def monthly_cost(p50_ms: dict, units: dict) -> list[tuple[str, float]]:
    per_month = 10 * 86400 * 30  # requests at 10/s, half usage reports, half selections
    rows = []
    dynamodb = sum(per_month / 2 / 1e6 * (u["wru"] * PRICES["dynamodb_per_million_wru"]
                                          + u["rru"] * PRICES["dynamodb_per_million_rru"]) for u in units.values())
    rows.append(("DynamoDB (measured units)", dynamodb))
    gb_seconds = sum(per_month / 2 * ms / 1000 * LAMBDA_MEMORY_GB for ms in p50_ms.values())
    rows.append(("Lambda (requests + GB-s at local p50)",
                 per_month / 1e6 * PRICES["lambda_per_million_requests"] + gb_seconds * PRICES["lambda_per_gb_second_arm64"]))
    rows.append(("API Gateway REST", per_month / 1e6 * PRICES["api_gateway_rest_per_million"]))
    rows.append(("total", sum(cost for _, cost in rows)))
    rows.append(("seed 000 estimate, DynamoDB only", SEED_ESTIMATE_DYNAMODB_USD))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--runs", type=int, default=9, help="fresh interpreters per cold-start import")
    args = parser.parse_args()

    cold_start.print_times(*cold_start.measure(args.runs), args.runs)

    with tempfile.TemporaryDirectory() as logs, local_server(Path(logs), KEY) as base:
        org_id, app_id = str(uuid.uuid4()), "bench"
        big = {"premium": 10**12, "standard": 10**12, "economy": 10**12}
        requests.put(f"{base}/api/v1/orgs/{org_id}", headers={"X-API-Key": KEY}, timeout=30, json={
            "org_name": "bench", "timezone": "UTC", "quota_scope": "APP",
            "model_ordering": ["premium", "standard", "economy"], "quotas": big}).raise_for_status()
        secret = requests.put(f"{base}/api/v1/orgs/{org_id}/apps/{app_id}", headers={"X-API-Key": KEY}, timeout=30,
                              json={"app_name": "bench"}).json()["credentials"]
        token = requests.post(f"{base}/auth/token", json={**secret, "grant_type": "client_credentials"},
                              timeout=30).json()["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        app = f"/api/v1/orgs/{org_id}/apps/{app_id}"

        def usage_body():
            return {"request_id": str(uuid.uuid4()), "model_label": "premium", "bedrock_model_id": "amazon.nova-pro-v1:0",
                    "input_tokens": 1000, "output_tokens": 500, "status": "OK",
                    "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}

        print(f"\nLocal server, {args.requests} requests on {args.threads} threads (loopback, moto)")
        p50 = {}
        for name, method, path, body in (("usage", "POST", f"{app}/usage", usage_body),
                                         ("model_selection", "GET", f"{app}/model-selection", None)):
            rps, p50[name], p99 = load(base, method, path, body, headers, args.requests, args.threads)
            print(f"  {name:16s} {rps:7.1f} req/s   p50 {p50[name]:6.1f} ms   p99 {p99:6.1f} ms")

    units = measured_units(UNIT_REQUESTS)
    print(f"\nDynamoDB per warm request, all-in ({UNIT_REQUESTS} requests through the handlers, one token, "
          "rate limits on; moto, units computed from item sizes)")
    for name, measured in units.items():
        print(f"  {name:16s} {measured['calls']:.3f} calls ({measured['by_operation']})  "
              f"{measured['wru']:g} WRU  {measured['rru']:g} RRU")

    print("\nProjected monthly cost at 10 req/s (USD)")
    for name, cost in monthly_cost(p50, units):
        print(f"  {name:40s} {cost:8.2f}")


if __name__ == "__main__":
    main()
