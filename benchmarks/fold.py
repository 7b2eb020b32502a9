"""The aggregator's fold of one stream batch (``ledger.fold_batch``), on moto: DynamoDB calls
per changed label-day and the time a batch takes, for batches of one record on each of 1, 20
and 100 label-days (each in a scope of its own: the worst case, a scope total each; a chunk
holds ``ledger.LABEL_DAYS_PER_CHUNK``), a container's first batch (configs read, label-days
listed) and a warm one. Then the audit (``domain.repair``): the plan's time and one worker
invocation's (10 messages of 100 label-days), extrapolated to 100,000 busy scopes x 3 labels.

    .venv/bin/python benchmarks/fold.py [audited scopes, default 200]

Time on moto (in process, no network) is the fold's own work and moto's; in a region add
~5-10 ms per round trip: per chunk, one read of the totals and one transaction.
"""

from __future__ import annotations

import contextlib
import io
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
from price_keeper.store.dynamo import ddb_client  # noqa: E402
from price_keeper.store.tables import ALL_TABLES  # noqa: E402
from price_keeper.timeutil import org_day  # noqa: E402

moto_patches.apply()  # serialised, per-item transaction rollback
TZ = "America/New_York"  # seed_org's


def fresh_store() -> None:
    state.reset()
    for spec in ALL_TABLES:
        boto3.client("dynamodb").create_table(**spec.create_table_kwargs())


def main() -> None:
    from local.gateway import LambdaContext, load_handler
    from local.streams import StreamReader
    from tests.factories import seed_org
    from tests.usage_support import put_records

    calls: Counter = Counter()
    print(f"{'labels':>6} {'batch':>6} {'calls':>6} {'per label':>9} {'seconds':>8}  calls by operation")
    for labels in (1, 20, 100):
        with mock_aws():
            fresh_store()
            aggregator = load_handler("aggregator")
            reader = StreamReader(tables.USAGE_AGG_SHARDED)
            scopes = [keys.org_key(seed_org(quota_scope="ORG")) for _ in range(labels)]
            ddb_client().meta.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
            for batch in ("first", "warm"):
                for scope in scopes:
                    put_records(scope, "premium", day=org_day(TZ))
                event = reader.event()
                calls.clear()
                started = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):  # its metrics (EMF lines)
                    aggregator(event, LambdaContext("aggregator"))
                seconds = time.perf_counter() - started
                total = sum(calls.values())
                print(f"{labels:>6} {batch:>6} {total:>6} {total / labels:>9.2f} {seconds:>8.2f}  {dict(calls)}")


def audit(scopes: int) -> None:
    import threading

    from local.streams import RepairQueue, RepairTrigger
    from price_keeper.domain import repair
    from tests.factories import seed_org
    from tests.usage_support import fold_usage, put_records

    with mock_aws():
        fresh_store()
        queue = RepairQueue()
        for _ in range(scopes):
            scope = keys.org_key(seed_org(quota_scope="ORG"))
            for label in ("premium", "standard", "economy"):
                put_records(scope, label, day=org_day(TZ))
        fold_usage()  # lists every label-day in the audit's index
        started = time.perf_counter()
        planned = repair.plan_audit()
        plan_s = time.perf_counter() - started
        trigger = RepairTrigger("aggregator", queue, threading.Event())
        started = time.perf_counter()
        invocations = 0
        with contextlib.redirect_stdout(io.StringIO()):  # its metrics (EMF lines)
            while trigger.deliver():
                invocations += 1
        work_s = time.perf_counter() - started
    label_days = planned["label_days"]
    per_invocation = work_s / invocations
    fleet = 100_000 * 3
    print(
        f"\naudit of {scopes} scopes x 3 labels: plan {plan_s:.2f} s "
        f"({planned['messages']} messages), {invocations} worker invocations, {per_invocation:.2f} s each "
        f"({label_days / work_s:.0f} label-days/s in one process)"
    )
    invocations_fleet = fleet / (100 * 10)
    print(
        f"100,000 scopes: plan ~{plan_s * fleet / label_days:.0f} s here (moto; the index pages and "
        f"SendMessageBatch calls), {invocations_fleet:.0f} invocations of ~{per_invocation:.1f} s, "
        f"at 50 at once ~{invocations_fleet / 50 * per_invocation / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
    audit(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
