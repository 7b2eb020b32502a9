"""The aggregator's fold of one stream batch, on moto: DynamoDB calls per changed label and
the time a batch takes, for batches touching 1, 20 and 100 labels (each label in a scope of
its own: the worst case, one transaction per label), a container's first batch (configs
and boosts read) and a warm one.

    .venv/bin/python benchmarks/fold.py

Time on moto (in process, no network) is the fold's own work and moto's; in a region add
~5-10 ms per round trip: one read per ~7 labels, and the transactions 8 at a time.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT)]
for name, value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "ERROR",
}.items():
    os.environ.setdefault(name, value)
for name in ("AWS_ENDPOINT_URL", "DYNAMODB_ENDPOINT_URL", "AWS_PROFILE"):
    os.environ.pop(name, None)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from price_keeper import state  # noqa: E402
from price_keeper.store import keys, tables  # noqa: E402
from price_keeper.store.dynamo import ddb_client, table  # noqa: E402
from price_keeper.store.tables import ALL_TABLES  # noqa: E402
from tests.moto_support import serialized_moto  # noqa: E402


def put_shard(scope: str, shard: int, requests: int) -> None:
    table(tables.USAGE_AGG_SHARDED).put_item(
        Item={
            "shard_key": keys.shard_key(scope, "premium", shard),
            "date_key": "DAY#20260123",
            "active_day": "DAY#20260123",
            "cost_usd_micros": 100 * requests,
            "requests": requests,
            "updated_at_epoch": int(time.time()),
        }
    )


def main() -> None:
    from local.gateway import LambdaContext, load_handler
    from local.streams import StreamReader, lambda_event
    from tests.factories import seed_org

    calls: Counter = Counter()
    print(f"{'labels':>6} {'batch':>6} {'calls':>6} {'per label':>9} {'seconds':>8}  calls by operation")
    for labels in (1, 20, 100):
        with mock_aws(), serialized_moto():
            state.reset()
            for spec in ALL_TABLES:
                boto3.client("dynamodb").create_table(**spec.create_table_kwargs())
            aggregator = load_handler("aggregator")
            reader = StreamReader(tables.USAGE_AGG_SHARDED)
            scopes = [keys.org_key(seed_org(quota_scope="ORG")) for _ in range(labels)]
            ddb_client().meta.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
            for batch, shard in (("first", 0), ("warm", 3)):
                for scope in scopes:
                    put_shard(scope, shard, 1 + shard)
                event = lambda_event(reader.read())
                calls.clear()
                started = time.perf_counter()
                aggregator(event, LambdaContext("aggregator"))
                seconds = time.perf_counter() - started
                total = sum(calls.values())
                print(f"{labels:>6} {batch:>6} {total:>6} {total / labels:>9.2f} {seconds:>8.2f}  {dict(calls)}")


if __name__ == "__main__":
    main()
