"""Dollars per million Bedrock calls of an instrumented app: reports batched in the
background (``instrument``'s default) against reported singly, and their ratio, in one run.

    .venv/bin/python benchmarks/instrumented_costs.py [--calls 2000] [--threads 4]

The real client library and the real service, in one process on moto: an app's
``bedrock-runtime`` client is ``instrument``-ed (``observe``) and makes ``--calls`` Converse
calls from ``--threads`` threads, answered by the local Bedrock stand-in
(``local/bedrock.py``, in process through botocore's ``before-send``); the keeper's HTTP
goes to the real Lambda handlers (``local/gateway.py``) through a ``requests`` adapter.
Counted per run: the API requests the keeper makes (token, label map, usage, batches; each is
one API Gateway and one Lambda request) and the DynamoDB calls and units those handlers
make (``dynamodb_costs.Meter``). Priced with ``fleet.py``'s model: us-east-1 list prices,
Lambda duration 5 ms a request plus 10 ms a DynamoDB call at 0.5 GB. The aggregator's
stream folds are left out of both (they depend on the records, not on how they were sent).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "client")]
import boto3  # noqa: E402
import dynamodb_costs  # noqa: E402, F401  (sets the layer's path and a test environment)
import requests  # noqa: E402
from botocore.awsrequest import AWSResponse  # noqa: E402
from dynamodb_costs import Meter, create_tables, print_table  # noqa: E402
from fleet import HTTP_GB, MS_BASE, MS_PER_CALL, PRICE  # noqa: E402
from moto import mock_aws  # noqa: E402

from local import moto_patches  # noqa: E402
from local.stack import JWT_SECRET_NAME, PROVISIONING_SECRET_NAME  # noqa: E402
from tests.tenants import ORG  # noqa: E402

KEY = "bench-provisioning-key"
MESSAGES = [{"role": "user", "content": [{"text": "How much did this cost? " * 10}]}]


class Gateway(requests.adapters.BaseAdapter):
    """The keeper's HTTP to the Lambda handlers, in process, counted by route."""

    def __init__(self):
        super().__init__()
        self.requests: Counter = Counter()
        self._lock = threading.Lock()

    def send(self, request, **_):
        from local import gateway

        url = urlsplit(request.url)
        with self._lock:
            self.requests[url.path.split("/")[-1] if "/usage" not in url.path else url.path.split("/web/")[-1]] += 1
        reply = gateway.invoke(
            request.method, url.path, body=request.body, headers=dict(request.headers), query=url.query
        )
        response = requests.Response()
        response.status_code = reply["statusCode"]
        response.headers.update(reply.get("headers") or {})
        body = reply.get("body") or b""
        response.raw = io.BytesIO(body if isinstance(body, bytes) else body.encode())
        response.url, response.request = request.url, request
        return response

    def close(self):
        pass


class _Raw:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def bedrock_client():
    """A bedrock-runtime client answered by the stand-in in process (its CloudWatch is moto's)."""
    from local.bedrock import Runtime

    runtime = Runtime()
    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url="https://bedrock.local")

    def answer(request, **_):
        reply = runtime.respond("POST", urlsplit(request.url).path, "us-east-1", request.body)
        body = reply["body"] if isinstance(reply["body"], bytes) else reply["body"].encode()
        return AWSResponse(request.url, reply["statusCode"], reply["headers"], _Raw(body))

    client.meta.events.register_first("before-send.bedrock-runtime", answer)
    return client


def provision(adapter: Gateway) -> tuple[str, str]:
    from price_keeper_client import Provisioning

    admin = Provisioning("http://api.local", KEY)
    admin.transport.session.mount("http://", adapter)
    org_id = str(uuid.uuid4())
    admin.put_org(org_id, {**ORG, "model_ordering": ["economy"], "quotas": {"economy": 10**12}})
    credentials = admin.put_app(org_id, "web", {"app_name": "web"}).credentials
    return credentials.client_id, credentials.client_secret


def run(calls: int, threads: int, batched: bool, meter: Meter) -> dict:
    from price_keeper_client import PriceKeeper, instrument

    adapter = Gateway()
    client_id, secret = provision(adapter)
    session = requests.Session()
    session.mount("http://", adapter)
    keeper = PriceKeeper("http://api.local", client_id, secret, session=session, report_in_background=batched)
    client = bedrock_client()
    instrument(client, keeper, background=batched)
    client.converse(modelId="amazon.nova-micro-v1:0", messages=MESSAGES)  # warm: token, label map, handlers
    assert keeper.flush(60)
    adapter.requests.clear()
    meter.reset()
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: client.converse(modelId="amazon.nova-micro-v1:0", messages=MESSAGES), range(calls)))
    assert keeper.flush(120)
    elapsed = time.perf_counter() - started
    counted = dict(adapter.requests)
    requests_made = sum(counted.values())
    ddb_calls = sum(meter.calls.values())
    gb_s = (requests_made * MS_BASE + ddb_calls * MS_PER_CALL) / 1000 * HTTP_GB
    dollars = (
        meter.wcu * PRICE["wru"]
        + meter.rcu * PRICE["rru"]
        + requests_made * (PRICE["http_api"] + PRICE["lambda_request"])
        + gb_s * PRICE["gb_second"]
    )
    keeper.close()
    return {
        "requests": counted,
        "api_requests_per_call": requests_made / calls,
        "ddb_calls_per_call": ddb_calls / calls,
        "wcu_per_call": meter.wcu / calls,
        "rcu_per_call": meter.rcu / calls,
        "usd_per_million_calls": dollars / calls * 1e6,
        "calls_per_second": calls / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    moto_patches.apply()
    with mock_aws():
        from price_keeper import state

        state.reset()
        create_tables()
        os.environ.update(
            JWT_SECRET_NAME=JWT_SECRET_NAME, PROVISIONING_SECRET_NAME=PROVISIONING_SECRET_NAME, RATE_LIMITS="off"
        )
        secrets = boto3.client("secretsmanager")
        secrets.create_secret(Name=JWT_SECRET_NAME, SecretString=uuid.uuid4().hex)
        secrets.create_secret(Name=PROVISIONING_SECRET_NAME, SecretString=KEY)
        from price_keeper.aws.events import event_bus

        boto3.client("events").create_event_bus(Name=event_bus())
        meter = Meter()
        results = {shape: run(args.calls, args.threads, shape == "batched", meter) for shape in ("single", "batched")}
    rows = [
        (
            shape,
            f"{r['api_requests_per_call']:.3f}",
            f"{r['ddb_calls_per_call']:.2f}",
            f"{r['wcu_per_call']:.2f}",
            f"{r['rcu_per_call']:.2f}",
            f"${r['usd_per_million_calls']:.2f}",
            f"{r['calls_per_second']:.0f}",
        )
        for shape, r in results.items()
    ]
    print_table(
        f"Instrumented app, {args.calls} Converse calls on {args.threads} threads (observe): per call",
        ("reports", "API requests", "DynamoDB calls", "WRU", "RRU", "$ / 1M calls", "calls/s"),
        rows,
    )
    single, batched = (results[shape]["usd_per_million_calls"] for shape in ("single", "batched"))
    print(f"single / batched: {single / batched:.2f}x")
    print(json.dumps({shape: r["requests"] for shape, r in results.items()}))


if __name__ == "__main__":
    main()
