"""DynamoDB calls and capacity units per operation of the metering and the ledger's fold, on moto.

    .venv/bin/python benchmarks/dynamodb_costs.py [--scopes 1000]

Calls are counted with botocore event hooks on the service's own client. moto's
``ConsumedCapacity`` is not what DynamoDB bills, so units are computed from item sizes
(attribute names + values, as DynamoDB sizes items):

- writes: 1 WCU per started KB of the larger of the item before and after; x2 inside a
  transaction; a conditional write that fails still costs its units; listing a label-day
  also writes its ``active-by-day`` index entry (1 WCU, once per label-day);
- reads: 0.5 RCU per started 4 KB eventually consistent, 1 strongly consistent, summed
  per item for GetItem/BatchGetItem and over all items for a Query.

Each operation is measured warm (config, prices and token checks cached in memory, as in
a warm Lambda container) for 1 active scope and for N active scopes (default 1,000): the
stream folds (``ledger.fold_batch`` on the records ``StreamReader`` reads) cost the same at
both (they read only the label-days they are handed), the audit (``repair.run``) grows
with the label-days listed. The last table prints the items a record writes as a day grows,
beside what the seed's ``request_ids`` string set would cost.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT)]


def bench_environment() -> None:
    """The environment of a benchmark: test credentials and Region, quiet Powertools, cheap
    bcrypt, and no endpoint of another run (set at import; a test that restored its
    environment after one harness sets it again for the next)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
        "BCRYPT_ROUNDS": "4",
    }.items():
        os.environ.setdefault(name, value)
    for name in ("AWS_ENDPOINT_URL", "DYNAMODB_ENDPOINT_URL", "AWS_PROFILE"):
        os.environ.pop(name, None)


bench_environment()

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from local import moto_patches  # noqa: E402
from price_keeper.bodies import UsageRequest  # noqa: E402
from price_keeper.config import get_config  # noqa: E402
from price_keeper.domain import aggregation, ledger, metering, orgs, repair, selection  # noqa: E402
from price_keeper.store import keys, tables  # noqa: E402
from price_keeper.store.dynamo import (  # noqa: E402
    ddb_client,  # noqa: E402
    item_size,
    plain,
)
from price_keeper.timeutil import org_day  # noqa: E402

WRITE_UNIT, READ_UNIT = 1024, 4096
TZ = "America/New_York"


class Meter:
    """Counts the calls the service's client makes and the capacity they cost."""

    def __init__(self):
        self.inspect = boto3.resource("dynamodb").meta.client  # a second client: not counted
        self.calls: Counter = Counter()
        self.by_thread: Counter = Counter()  # calls by the name of the thread that made them (a run's critical path)
        self.wcu = self.rcu = 0.0
        self._call = threading.local()  # the call in flight, per thread (the fold writes in parallel)
        self._lock = threading.Lock()
        self.attach()

    def attach(self) -> None:
        """Hook the service's client (again, after ``state.reset`` dropped it)."""
        events = ddb_client().meta.events
        events.register("provide-client-params.dynamodb", self._remember)
        events.register("after-call.dynamodb", self._account)

    def reset(self) -> None:
        self.calls.clear()
        self.by_thread.clear()
        self.wcu = self.rcu = 0.0

    def _remember(self, params, model, **_):
        self._call.params, self._call.before = dict(params), []
        if model.name == "TransactWriteItems":  # item sizes before the update
            self._call.before = [
                self._size(body["TableName"], body["Key"]) if kind == "Update" else 0
                for kind, body in (next(iter(a.items())) for a in params["TransactItems"])
            ]
        elif model.name == "UpdateItem":
            self._call.before = [self._size(params["TableName"], params["Key"])]

    def _size(self, table_name: str, key: dict) -> int:
        item = self.inspect.get_item(TableName=table_name, Key=key).get("Item")
        return item_size(item) if item else 0

    def _key(self, table_name: str, item: dict) -> dict:
        spec = next(s for s in tables.ALL_TABLES if s.physical_name == table_name)
        return {name: item[name] for name in (spec.partition_key, spec.sort_key) if name}

    def _read_units(self, size: int, consistent: bool) -> float:
        return max(1, math.ceil(size / READ_UNIT)) * (1.0 if consistent else 0.5)

    def _account(self, model, parsed, **_):
        with self._lock:
            self._add(model.name, self._call.params, self._call.before, parsed)

    def _add(self, operation: str, params: dict, before_sizes: list[int], parsed: dict) -> None:
        self.calls[operation] += 1
        self.by_thread[threading.current_thread().name] += 1  # names, unlike ids, are not reused
        if operation == "TransactWriteItems":
            for action, before in zip(params["TransactItems"], before_sizes, strict=True):
                kind, body = next(iter(action.items()))
                size = item_size(body["Item"]) if kind == "Put" else self._size(body["TableName"], body["Key"])
                self.wcu += 2 * max(1, math.ceil(max(size, before) / WRITE_UNIT))
                if kind == "Update" and before == 0 and "active_day" in body["UpdateExpression"]:
                    self.wcu += 1  # a new label-day's index entry
        elif operation == "UpdateItem":  # billed on the larger of before and after, failed or not
            after = self._size(params["TableName"], params["Key"])
            self.wcu += max(1, math.ceil(max(after, before_sizes[0]) / WRITE_UNIT))
        elif operation == "PutItem":
            self.wcu += max(1, math.ceil(item_size(params["Item"]) / WRITE_UNIT))
        elif operation == "GetItem":
            self.rcu += self._read_units(self._size(params["TableName"], params["Key"]), params.get("ConsistentRead"))
        elif operation == "BatchGetItem":
            for table_name, request in params["RequestItems"].items():
                for key in request["Keys"]:
                    self.rcu += self._read_units(self._size(table_name, key), request.get("ConsistentRead"))
        elif operation == "Query":
            items = parsed.get("Items", [])
            self.rcu += self._read_units(sum(item_size(as_plain(item)) for item in items), params.get("ConsistentRead"))


_TYPE_TAGS = {"S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"}


def as_plain(item: dict) -> dict:
    """An item as plain values whether or not boto3's transformer already converted it."""
    typed = all(isinstance(v, dict) and len(v) == 1 and next(iter(v)) in _TYPE_TAGS for v in item.values())
    return plain(item) if typed else item


def create_tables() -> None:
    client = boto3.client("dynamodb")
    for spec in tables.ALL_TABLES:
        client.create_table(**spec.create_table_kwargs())


def seed_scopes(count: int) -> list[tuple[str, str]]:
    """``count`` orgs with one app each (APP scope), as provisioning makes them: the
    default marker buckets, boosts kept on the config items."""
    config = boto3.resource("dynamodb").Table(tables.CONFIG.physical_name)
    tenants = []
    with config.batch_writer() as batch:
        for _ in range(count):
            org_id, app_id = str(uuid.uuid4()), "app-1"
            batch.put_item(
                Item={
                    "org_key": keys.org_key(org_id),
                    "resource_key": "#",
                    "org_name": "bench",
                    "timezone": TZ,
                    "quota_scope": "APP",
                    "model_ordering": ["premium", "standard", "economy"],
                    "quotas": {"premium": 10**12, "standard": 10**12, "economy": 10**12},
                    "agg_shard_count": get_config().metering.usage_agg_shard_count,
                    "quota_boosts": {},
                    "sticky_fallback_enabled": True,
                }
            )
            batch.put_item(
                Item={
                    "org_key": keys.org_key(org_id),
                    "resource_key": keys.app_resource(app_id),
                    "app_name": "bench",
                    "quota_boosts": {},
                }
            )
            tenants.append((org_id, app_id))
    return tenants


def usage(label: str = "premium") -> UsageRequest:
    return UsageRequest.model_validate(
        {
            "request_id": str(uuid.uuid4()),
            "model_label": label,
            "bedrock_model_id": get_config().labels[label].id,
            "input_tokens": 1500,
            "output_tokens": 800,
            "status": "OK",
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )


def measure(meter: Meter, action) -> tuple[str, float, float]:
    meter.reset()
    action()
    calls = ", ".join(f"{count} {name}" for name, count in sorted(meter.calls.items()))
    return calls, meter.wcu, meter.rcu


def through_handlers(
    meter: Meter, requests: int, busy_day: int = 100, batches: int = 5
) -> dict[str, tuple[str, float, float, float]]:
    """Usage submission and model selection, ``requests`` times each, and usage batches of
    100 records ``batches`` times, through their real Lambda handlers (API Gateway events,
    in process) with one access token and rate limits on, as one warm container serves a
    busy client, after ``busy_day`` submissions (so its label-day is listed). Per
    request: the calls, WCU and RCU, with token checks and rate-limit leases amortised over
    the run."""
    from local import gateway
    from local.stack import JWT_SECRET_NAME
    from price_keeper.domain import auth

    os.environ.update(RATE_LIMITS="on", JWT_SECRET_NAME=JWT_SECRET_NAME)
    boto3.client("secretsmanager").create_secret(Name=JWT_SECRET_NAME, SecretString=uuid.uuid4().hex)
    org_id, app_id = seed_scopes(1)[0]
    for _ in range(busy_day):
        metering.submit(org_id, app_id, usage())
    headers = {
        "Authorization": "Bearer " + auth.issue_tokens(auth.Principal(org_id, app_id))["access_token"],
        "Content-Type": "application/json",
    }
    app = f"/api/v1/orgs/{org_id}/apps/{app_id}"
    calls = {
        "usage": (requests, lambda: gateway.invoke("POST", f"{app}/usage", headers=headers, body=usage().model_dump())),
        "model_selection": (requests, lambda: gateway.invoke("GET", f"{app}/model-selection", headers=headers)),
        "usage_batch": (
            batches,
            lambda: gateway.invoke(
                "POST",
                f"{app}/usage/batch",
                headers=headers,
                body={"requests": [usage().model_dump() for _ in range(100)]},
            ),
        ),
    }
    measured = {}
    for name, (count, call) in calls.items():
        assert call()["statusCode"] < 300  # cold: config, prices, the token's revocation check
        meter.reset()
        for _ in range(count):
            reply = call()
            assert reply["statusCode"] < 300, reply
        per_call = ", ".join(f"{n / count:g} {operation}" for operation, n in sorted(meter.calls.items()))
        measured[name] = (per_call, sum(meter.calls.values()) / count, meter.wcu / count, meter.rcu / count)
    return measured


def fold_event(event: dict) -> aggregation.RunReport:
    """A stream shard's batch folded as the aggregator folds it (``ledger.fold_batch``),
    without the handler's alerts and metrics."""
    from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

    return ledger.fold_batch(DynamoDBStreamEvent(event).records, event["shardId"]).report


def fold_all(stream, read: dict[str, list[dict]] | None = None) -> int:
    """Fold what ``stream`` gained (or its records ``read`` already), each shard's records in
    batches of the mapping's size (``USAGE_STREAM.batch_size``): the batches folded."""
    from local.streams import lambda_event

    batches = 0
    for shard_id, records in (stream.read() if read is None else read).items():
        size = aggregation.USAGE_STREAM.batch_size
        for first in range(0, len(records), size):
            fold_event(lambda_event(records[first : first + size], shard_id))
            batches += 1
    return batches


def stream_folds(
    meter: Meter, records_per_batch: tuple[int, ...] = (1, 10, 100)
) -> list[tuple[str, str, float, float]]:
    """The aggregator function on stream batches of one scope's usage (one label), as the
    event source mapping invokes it, warm: the calls and units of one batch of each size
    (alerts included; the heartbeat, written at most once per 10 s per container, is not:
    see the first row)."""
    from local.streams import StreamReader
    from price_keeper import state

    state.reset()  # a fresh container: its first fold writes the heartbeat
    meter.attach()
    org_id, app_id = seed_scopes(1)[0]
    stream = StreamReader(tables.USAGE_AGG_SHARDED)
    stream.read()
    metering.submit(org_id, app_id, usage())
    first = stream.event()
    rows = [("stream fold, first of the container (heartbeat included)", *measure(meter, lambda: fold_event(first)))]
    for count in records_per_batch:
        for _ in range(count):
            metering.submit(org_id, app_id, usage())
        event = stream.event()
        rows.append(
            (
                f"stream fold, batch of {count} usage records (1 label)",
                *measure(meter, lambda event=event: handler(event)),
            )
        )
    rows.append(("stream fold, the same batch delivered again", *measure(meter, lambda: handler(event))))
    return rows


def many_labels(meter: Meter, labels: int = 400) -> list[tuple[str, str, float, float]]:
    """A scope that has spent on ``labels`` labels today (an app of a profile per customer,
    labels of 40 characters), folded: what one more record's stream fold (on a label folded
    before) and a selection cost there."""
    from local.streams import StreamReader
    from tests.usage_support import put_records

    org_id, app_id = seed_scopes(1)[0]
    scope = keys.scope_key(org_id, app_id, "APP")
    day = org_day(TZ, datetime.now(UTC))
    stream = StreamReader(tables.USAGE_AGG_SHARDED)
    for n in range(labels):
        put_records(scope, f"customer-{uuid.UUID(int=n).hex[1:]}", day=day, cost=10)
    metering.submit(org_id, app_id, usage())
    fold_all(stream)
    metering.submit(org_id, app_id, usage())
    event = stream.event()
    selection.select_model(org_id, app_id)
    return [
        (
            f"stream fold, 1 record, in a scope that spent on {labels} labels today",
            *measure(meter, lambda: fold_event(event)),
        ),
        (
            f"model selection (force_check), in a scope that spent on {labels} labels today",
            *measure(meter, lambda: selection.select_model(org_id, app_id, force_check=True)),
        ),
    ]


def handler(event: dict):
    """The aggregator function itself (fold, alerts, metrics)."""
    from local.gateway import LambdaContext, load_handler

    return load_handler("aggregator")(event, LambdaContext(function_name="aggregator"))


def activate(tenants, submissions_per_scope: int) -> None:
    """Give every scope usage today on all three labels (markers, folded by ``fold_all``)."""
    for org_id, app_id in tenants:
        for index in range(submissions_per_scope):
            metering.submit(org_id, app_id, usage(("premium", "standard", "economy")[index % 3]))


def scenario(meter: Meter, scopes: int, submissions_per_scope: int) -> list[tuple[str, str, float, float]]:
    from local.streams import StreamReader

    tenants = seed_scopes(scopes)
    org_id, app_id = tenants[0]
    rows = []
    metering.submit(org_id, app_id, usage())  # warm: config, price and profile lookups cached
    rows.append(
        ("usage submission (warm, new request_id)", *measure(meter, lambda: metering.submit(org_id, app_id, usage())))
    )
    rows.append(
        (
            "usage submission (warm, asking for the selection)",
            *measure(meter, lambda: metering.submit(org_id, app_id, usage(), with_selection=True)),
        )
    )
    repeated = usage()
    metering.submit(org_id, app_id, repeated)
    rows.append(
        ("usage submission (duplicate request_id)", *measure(meter, lambda: metering.submit(org_id, app_id, repeated)))
    )
    rows.append(
        (
            "usage batch of 100 (per call)",
            *measure(meter, lambda: metering.submit_batch(org_id, app_id, [usage().model_dump() for _ in range(100)])),
        )
    )
    stream = StreamReader(tables.USAGE_AGG_SHARDED)
    fold_all(stream)
    activate(tenants, submissions_per_scope)
    labels = min(3, submissions_per_scope)
    rows.append(
        (
            f"stream folds of {scopes * submissions_per_scope} records, {scopes} scopes x {labels} labels",
            *measure(meter, lambda: fold_all(stream)),
        )
    )
    rows.append((f"audit ({scopes * labels} label-days listed)", *measure(meter, repair.run)))
    selection.select_model(org_id, app_id)
    rows.append(("model selection (warm)", *measure(meter, lambda: selection.select_model(org_id, app_id))))
    rows.append(
        (
            "model selection (force_check)",
            *measure(meter, lambda: selection.select_model(org_id, app_id, force_check=True)),
        )
    )
    return rows


def sizes_as_a_day_grows(org_id: str, app_id: str, counts: tuple[int, ...] = (1, 1000, 5000)) -> list[tuple]:
    """After each of ``counts`` records of one label today, folded: the largest marker the
    stream carried and the label total's size (bytes)."""
    from local.streams import StreamReader

    config = orgs.effective_config(org_id, app_id)
    now = datetime.now(UTC)
    stream = StreamReader(tables.USAGE_AGG_SHARDED)
    fold_all(stream)
    sizes, done = [], 0
    for count in counts:
        for _ in range(count - done):
            metering.record(metering.prepare(config, usage(), now), now)
        done = count
        read = stream.read()
        marker = max(
            item_size(as_plain(record["dynamodb"]["NewImage"]))
            for records in read.values()
            for record in records
            if keys.is_marker(record["dynamodb"]["Keys"]["date_key"]["S"]) and "NewImage" in record["dynamodb"]
        )
        fold_all(stream, read)
        usage_key, date_key = keys.usage_key(config.scope, "premium"), keys.day_key(org_day(TZ, now))
        total = boto3.resource("dynamodb").Table(tables.DAILY_TOTAL.physical_name)
        sizes.append(
            (count, marker, item_size(total.get_item(Key={"usage_key": usage_key, "date_key": date_key})["Item"]))
        )
    return sizes


def print_table(title: str, header: tuple, rows: list) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scopes", type=int, default=1000, help="active scopes of the large scenario")
    parser.add_argument("--submissions-per-scope", type=int, default=3)
    args = parser.parse_args()
    results = []
    for scopes in (1, args.scopes):
        moto_patches.apply()
        with mock_aws():
            from price_keeper import state

            state.reset()
            create_tables()
            meter = Meter()
            for name, calls, wcu, rcu in scenario(meter, scopes, args.submissions_per_scope):
                results.append((name, scopes, calls, f"{wcu:g}", f"{rcu:g}"))
            for name, calls, wcu, rcu in stream_folds(meter) + (many_labels(meter) if scopes == 1 else []):
                results.append((name, scopes, calls, f"{wcu:g}", f"{rcu:g}"))
            if scopes == 1:
                sizes = sizes_as_a_day_grows(*seed_scopes(1)[0])
    results.sort(key=lambda row: (row[0], row[1]))
    print_table(
        "DynamoDB per operation (computed from item sizes; moto)",
        ("operation", "active scopes", "calls", "WCU", "RCU"),
        results,
    )
    seed_rows = []
    for submissions, marker, total in sizes:
        # the seed's dedup: every request_id (a UUID in a string set, 37 B) on one of 8 shard items
        shard = item_size({"shard_key": "x" * 80, "date_key": "DAY#20260101", "cost_usd_micros": 10**9, "requests": 1})
        seed_size = shard + 37 * submissions / 8
        seed_rows.append(
            (
                submissions,
                f"{marker} B",
                f"{total} B",
                math.ceil(marker / WRITE_UNIT),
                f"{seed_size / 1024:.1f} KB",
                math.ceil(seed_size / WRITE_UNIT),
            )
        )
    print_table(
        "Write units per record as a day grows (one label; the fold's write of the label total is shared by its batch)",
        (
            "records today",
            "marker (ours)",
            "label total (ours)",
            "WCU ours",
            "shard with request_ids (seed)",
            "WCU seed",
        ),
        seed_rows,
    )


if __name__ == "__main__":
    main()
