"""The aggregator's fold of one stream batch, on moto: DynamoDB calls per changed label and
the time a batch takes, for batches touching 1, 20 and 100 labels (each label in a scope of
its own: the worst case, one transaction per label), a container's first batch (configs
and boosts read) and a warm one. Then the audit (``domain.repair``): the plan's time and
one worker invocation's (10 messages of 100 label-days), extrapolated to 100,000 busy
scopes x 3 labels.

    .venv/bin/python benchmarks/fold.py [audited scopes, default 200]

Time on moto (in process, no network) is the fold's own work and moto's; in a region add
~5-10 ms per round trip: one read per ~7 labels, and the transactions 8 at a time.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import boto3  # noqa: E402
import dynamodb_costs  # noqa: E402, F401 (on import: the layer on sys.path and moto's environment)
from moto import mock_aws  # noqa: E402

from local import moto_patches  # noqa: E402
from price_keeper import state  # noqa: E402
from price_keeper.store import keys, tables  # noqa: E402
from price_keeper.store.dynamo import ddb_client, table  # noqa: E402
from price_keeper.store.tables import ALL_TABLES  # noqa: E402

moto_patches.apply()  # serialised, per-item transaction rollback


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
    from local.streams import StreamReader
    from tests.factories import seed_org

    calls: Counter = Counter()
    print(f"{'labels':>6} {'batch':>6} {'calls':>6} {'per label':>9} {'seconds':>8}  calls by operation")
    for labels in (1, 20, 100):
        with mock_aws():
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
                event = reader.event()
                calls.clear()
                started = time.perf_counter()
                aggregator(event, LambdaContext("aggregator"))
                seconds = time.perf_counter() - started
                total = sum(calls.values())
                print(f"{labels:>6} {batch:>6} {total:>6} {total / labels:>9.2f} {seconds:>8.2f}  {dict(calls)}")


def audit(scopes: int) -> None:
    import threading

    from local.streams import RepairQueue, RepairTrigger
    from price_keeper.domain import repair
    from price_keeper.timeutil import utc_now

    today = utc_now().strftime("%Y%m%d")
    with mock_aws():
        state.reset()
        for spec in ALL_TABLES:
            boto3.client("dynamodb").create_table(**spec.create_table_kwargs())
        queue = RepairQueue()
        for _ in range(scopes):
            scope = keys.org_key(seed_org_for_bench())
            for label in ("premium", "standard", "economy"):
                for shard in range(8):
                    table(tables.USAGE_AGG_SHARDED).put_item(
                        Item={
                            "shard_key": keys.shard_key(scope, label, shard),
                            "date_key": keys.day_key(today),
                            "active_day": keys.day_key(today),
                            "cost_usd_micros": 1,
                            "requests": 1,
                            "updated_at_epoch": int(time.time()),
                        }
                    )
        started = time.perf_counter()
        planned = repair.plan_audit()
        plan_s = time.perf_counter() - started
        trigger = RepairTrigger("aggregator", queue, threading.Event())
        started = time.perf_counter()
        invocations = 0
        while trigger.deliver():
            invocations += 1
        work_s = time.perf_counter() - started
    label_days = planned["label_days"]
    per_invocation = work_s / invocations
    fleet = 100_000 * 3
    print(
        f"\naudit of {scopes} scopes x 3 labels x 8 shards: plan {plan_s:.2f} s "
        f"({planned['messages']} messages), {invocations} worker invocations, {per_invocation:.2f} s each "
        f"({label_days / work_s:.0f} label-days/s in one process)"
    )
    invocations_fleet = fleet / (100 * 10)
    print(
        f"100,000 scopes: plan ~{plan_s * fleet / label_days:.0f} s here (moto; the index pages and "
        f"SendMessageBatch calls), {invocations_fleet:.0f} invocations of ~{per_invocation:.1f} s, "
        f"at 50 at once ~{invocations_fleet / 50 * per_invocation / 60:.1f} min"
    )


def seed_org_for_bench() -> str:
    from tests.factories import seed_org

    return seed_org(quota_scope="ORG")


if __name__ == "__main__":
    main()
    audit(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
