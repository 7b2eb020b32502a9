"""The fold of a hot label and a hot org at 1,000 records/s, on a modelled clock.

    .venv/bin/python benchmarks/hot_label.py [--shards 16] [--read-ms 10] [--transaction-ms 20]

This 2-core machine cannot drive a thousand records a second through moto in real time
(benchmarks/stream_shards.py does the same in real time at the rates it can reach). Here the
records of each second are made as the service makes them, keyed by the real
``keys.marker_key``, routed to ``--shards`` stream shards by partition key as DynamoDB routes
them (``local.moto_patches``: one key, one shard), and cut into chunks by the real
``ledger.chunks``. A model then times each shard's second of work: a chunk is a read and a
transaction; a chunk's transaction touching a total another shard's fold is writing is
cancelled and tried again, with the probability that another writer's read-to-commit window
covers it (``--read-ms`` + ``--transaction-ms``). A shard keeps up when its second of work
takes under a second; its iterator age is then the batching window plus that work.

Scenarios (the issue's "must hold" table): one config label at 1,000 records/s among 1,000
records/s of other label-days (a platform's tenants, each record its own label-day); one org
with 300 label-days at 1,000 records/s. Each is run for the design as built (markers under an
org's ``agg_shard_count`` buckets, chunks cut by their writes) and for request-keyed markers
with 19 label-days a chunk (the design before), as the ratio's peer.
"""

from __future__ import annotations

import argparse
import sys
import uuid
import zlib
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402, F401  (sets the layer's path and a benchmark environment)

from price_keeper.domain import ledger  # noqa: E402
from price_keeper.store import keys  # noqa: E402

CONFIG_LABELS = ("premium", "standard", "economy")
DAY = keys.day_key("20261129")
BATCHING_WINDOW_S = 1.0


def shard_of(partition_key: str, shards: int) -> int:
    return zlib.crc32(partition_key.encode()) % shards


def change(position: int, scope: str, label: str) -> ledger.Change:
    return ledger.Change(position, f"{position:040d}", ((keys.usage_key(scope, label), DAY),), {}, 0, 0, 0)


def second_of(records: list[tuple[str, str, str]], shards: int, bucketed: bool) -> dict[int, list[ledger.Change]]:
    """One second's records (org, app scope, label) by the stream shard each reaches."""
    by_shard: dict[int, list[ledger.Change]] = defaultdict(list)
    for position, (org_id, scope, label) in enumerate(records):
        request_id = str(uuid.uuid4())
        if bucketed:
            partition = keys.marker_key(org_id, "app-1", request_id, 8)["shard_key"]
        else:
            partition = keys.dedup_key(org_id, "app-1", request_id)
        by_shard[shard_of(partition, shards)].append(change(position, scope, label))
    return by_shard


def old_chunks(found: list[ledger.Change]) -> list[list[ledger.Change]]:
    """Chunks of at most 19 label-days, as the fold cut them before."""
    cut: list[list[ledger.Change]] = []
    label_days: set = set()
    for item in found:
        if not cut or len(label_days | set(item.label_days)) > 19:
            cut.append([])
            label_days = set()
        cut[-1].append(item)
        label_days |= set(item.label_days)
    return cut


def totals_of(chunk: list[ledger.Change]) -> set:
    """The totals a chunk's transaction writes: its label totals, and the scope totals of
    the labels that are not config labels."""
    totals = {label_day for item in chunk for label_day in item.label_days}
    return totals | {(keys.split_usage_key(u)[0] + "#TOTAL", d) for u, d in totals if not u.endswith(CONFIG_LABELS)}


def model(by_shard: dict[int, list[ledger.Change]], cut, read_ms: float, transaction_ms: float) -> dict:
    """Each shard's second of work on the modelled clock, and what the busiest total saw."""
    chunks = {shard: cut(found) for shard, found in by_shard.items()}
    # transactions a second on each total, and by how many shards
    writes: Counter = Counter()
    for shard_chunks in chunks.values():
        for chunk in shard_chunks:
            writes.update(totals_of(chunk))
    window = (read_ms + transaction_ms) / 1000
    busy = {}
    for shard, shard_chunks in chunks.items():
        seconds = 0.0
        for chunk in shard_chunks:
            totals = totals_of(chunk)
            # others' transactions on the chunk's busiest total within its read-to-commit window
            others = max(writes[total] - 1 for total in totals) if totals else 0
            conflict = min(0.95, others * window)
            seconds += window / (1 - conflict)  # attempts until one lands, each a read and a write
        busy[shard] = seconds
    hottest = max(writes.values())
    return {
        "transactions": sum(len(c) for c in chunks.values()),
        "hottest_total_tx_s": hottest,
        "slowest_shard_s": max(busy.values()),
        "keeps_up": max(busy.values()) < BATCHING_WINDOW_S,
        "iterator_age_s": BATCHING_WINDOW_S + max(busy.values()),
    }


def scenarios(rate: int) -> dict[str, list[tuple[str, str, str]]]:
    hot_org = str(uuid.uuid4())
    hot_scope = keys.scope_key(hot_org, "app-1", "APP")
    platform = [(str(uuid.uuid4()), f"label-{n}") for n in range(rate)]
    org_300 = str(uuid.uuid4())
    return {
        "hot label among the platform": [(hot_org, hot_scope, "premium")] * rate
        + [(org, keys.scope_key(org, "app-1", "APP"), CONFIG_LABELS[n % 3]) for n, (org, _) in enumerate(platform)],
        "one org, 300 label-days (100 apps x 3 config labels)": [
            (org_300, keys.scope_key(org_300, f"app-{n % 100}", "APP"), CONFIG_LABELS[n % 3]) for n in range(rate)
        ],
        "one ORG-scoped org, 300 profile labels (one scope total)": [
            (org_300, keys.org_key(org_300), f"profile-{n % 300}") for n in range(rate)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rate", type=int, default=1000, help="records a second, of each kind")
    parser.add_argument("--read-ms", type=float, default=10)
    parser.add_argument("--transaction-ms", type=float, default=20)
    args = parser.parse_args()
    print(
        f"modelled clock: {args.shards} stream shards, a read {args.read_ms:g} ms, a transaction "
        f"{args.transaction_ms:g} ms (real chunking and keys; modelled DynamoDB latencies)"
    )
    for name, records in scenarios(args.rate).items():
        records = sorted(records, key=lambda _: uuid.uuid4().int)  # arrivals interleaved
        # a second of a busy day: a label-day of many records was folded before (its first
        # second listed it); the platform's label-days of one record each are all first folds
        by_day = Counter((scope, label) for _, scope, label in records)
        busy = {(keys.usage_key(scope, label), DAY) for (scope, label), count in by_day.items() if count > 1}
        built = model(
            second_of(records, args.shards, True),
            lambda found, busy=busy: ledger.chunks(found, CONFIG_LABELS, busy),
            args.read_ms,
            args.transaction_ms,
        )
        before = model(second_of(records, args.shards, False), old_chunks, args.read_ms, args.transaction_ms)
        print(f"\n{name} ({len(records)} records/s)")
        for label, figures in (("as built", built), ("before", before)):
            work = figures["slowest_shard_s"]
            age = (
                f"keeps up, iterator age ~{figures['iterator_age_s']:.1f} s"
                if figures["keeps_up"]
                else f"FALLS BEHIND: its iterator age grows ~{work - 1:.1f} s every second"
            )
            print(
                f"  {label:9} transactions/s {figures['transactions']:5}  "
                f"hottest total {figures['hottest_total_tx_s']:4} tx/s  "
                f"slowest shard {work:.2f} s of work a second: {age}"
            )
        print(f"  slowest shard, before / as built: {before['slowest_shard_s'] / built['slowest_shard_s']:.1f}x")


if __name__ == "__main__":
    main()
