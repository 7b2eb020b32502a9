"""The ledger's fold in real time on a stream of many shards: a hot label among other label-days.

    .venv/bin/python benchmarks/stream_shards.py [--shards 16] [--hot 40] [--background 40] [--seconds 30]

A moto server in a process of its own (the fleet harness's ``Endpoint``) serves the usage
stream as ``--shards`` shards, a record's by its partition key, and cancels a transaction
that touches an item another one holds (``--transaction-ms``), as DynamoDB does
(``local/moto_patches.py``). This process reports usage from ``--threads`` threads through
the real metering code, ``--hot`` records a second on one label-day and ``--background`` a
second each on a label-day of its own (a platform's other tenants), for ``--seconds``; the
local trigger folds the shards' batches at once, one at a time per shard
(``local/streams.py``), with the real aggregator function.

It prints what was offered and folded a second, how far the fold lagged behind the reports
at the end of the load (the stream's iterator age, as seconds since the reports the totals
stop at were accepted) and how long it took to catch up after, the fold's transactions and
how many were cancelled (by a stale read or a conflict), and whether every total is exact.
This 2-core machine drives a few hundred records a second in real time, not a thousand:
the figures are for the shape of the fold's behaviour (does it keep up, does it drain), and
every DynamoDB call here is a moto call served one at a time (~1-3 ms), not DynamoDB's.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402  (sets the layer's path and a benchmark environment)

from price_keeper.store import daily_totals, keys, tables  # noqa: E402
from price_keeper.timeutil import org_day  # noqa: E402


class Transactions:
    """The fold's TransactWriteItems in this process, and why the cancelled ones were."""

    def __init__(self):
        self.count, self.cancelled = 0, Counter()
        real = daily_totals.transact

        def counted(actions):
            self.count += 1
            reasons = real(actions)
            if reasons:
                self.cancelled.update({reason.get("Code") for reason in reasons} - {None, "None"})
            return reasons

        daily_totals.transact = counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--hot", type=float, default=40, help="records a second on the hot label-day")
    parser.add_argument("--background", type=float, default=40, help="records a second, each its own label-day")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--transaction-ms", type=float, default=fleet.TRANSACTION_HOLD_MS)
    args = parser.parse_args()

    from local.streams import StreamReader, StreamTrigger
    from price_keeper.bodies import UsageRequest
    from price_keeper.domain import metering
    from tests.usage_support import usage_body

    server = fleet.Endpoint(transaction_hold_ms=args.transaction_ms, stream_shards=args.shards)
    background_count = int(args.background * args.seconds)
    hot, *background = fleet.seed_scopes(1 + background_count)
    transactions = Transactions()
    stop = threading.Event()
    trigger = StreamTrigger("aggregator", StreamReader(tables.USAGE_AGG_SHARDED), stop)
    trigger.start()
    accepted: list[float] = []  # when each report was accepted, in order
    costs: Counter = Counter()
    lock = threading.Lock()

    def report(org_app: tuple[str, str]) -> None:
        body = usage_body(model_label="premium", input_tokens=1000, output_tokens=100)
        cost = metering.submit(*org_app, UsageRequest.model_validate(body))["processing"]["cost_usd_micros"]
        with lock:
            accepted.append(time.monotonic())
            costs[org_app] += cost

    schedule = sorted(
        [(n / args.hot, hot) for n in range(int(args.hot * args.seconds))]
        + [(n / args.background, scope) for n, scope in enumerate(background)]
    )
    day = org_day(fleet.dynamodb_costs.TZ)
    usage_keys = {
        keys.usage_key(keys.scope_key(org, app, "APP"), "premium"): (org, app) for org, app in [hot, *background]
    }

    def folded() -> tuple[int, dict]:
        found = daily_totals.read_days([(usage_key, day) for usage_key in usage_keys])
        return sum(int(item["requests"]) for item in found.values()), found

    started = time.monotonic()
    with ThreadPoolExecutor(args.threads) as pool:
        for at, scope in schedule:
            time.sleep(max(0.0, started + at - time.monotonic()))
            pool.submit(report, scope)
    offered_for = time.monotonic() - started
    load_over = time.monotonic()
    done, _ = folded()
    lag = load_over - accepted[done - 1] if done else load_over - started
    while (done := folded()[0]) < len(accepted):
        time.sleep(0.2)
    drained = time.monotonic() - load_over
    time.sleep(2)  # a record counted twice would show by now
    total, found = folded()
    stop.set()
    trigger.join(30)
    server.stop()
    exact = total == len(accepted) and all(
        int(found[(usage_key, day)]["cost_usd_micros"]) == costs[org_app] for usage_key, org_app in usage_keys.items()
    )
    print(
        f"{args.shards} stream shards, transactions held {args.transaction_ms:g} ms, {args.threads} reporting threads"
    )
    print(f"offered   {len(accepted) / offered_for:8.1f} records/s for {offered_for:.1f} s (hot {args.hot:g}/s)")
    print(f"folded    {total / (offered_for + drained):8.1f} records/s over the load and the drain")
    print(f"lag       {lag:8.1f} s behind the reports when the load stopped (the iterator age)")
    print(f"drained   {drained:8.1f} s after the load stopped")
    print(f"fold      {transactions.count:8d} transactions, cancelled: {dict(transactions.cancelled) or 'none'}")
    print(f"exact     {exact} ({total} requests folded of {len(accepted)} accepted)")


if __name__ == "__main__":
    main()
