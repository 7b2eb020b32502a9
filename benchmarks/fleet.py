"""The real code run as a fleet: N container processes against one DynamoDB endpoint.

    .venv/bin/python benchmarks/fleet.py [--containers 6] [--tenants 8] [--records 1600]
    .venv/bin/python benchmarks/fleet.py --rate-limits-only --containers 24

Each container is an OS process with its own process state (caches, leased rate-limit
allowance, boto3 clients) that calls the real Lambda handlers with API Gateway events, as
``local/gateway.py`` does, one request at a time. All of them talk to ONE moto server,
started here in a process of its own with the tables of ``store/tables.py`` (the local
stack's), patched as the local stack runs it (``local/moto_patches.py``: one DynamoDB request at a
time, transactions rolled back per item) and with DynamoDB's transaction conflicts modelled
(``--transaction-ms``: how long a transaction holds its items). The parent is the
aggregator: it polls the usage stream and invokes the aggregator function with Lambda-shaped
batches (``local/streams.py``).

Two runs:

- **metering**: tenants (orgs with one app, three labels) of two shapes, half each: *single*
  clients report every call alone; *batched* clients report in batches and select once per
  ``--select-every`` calls. Both are the client library's cached selection (300 s in normal
  mode): at fleet shape an app calls every ~86 s (1,000 calls a day), so a choice lives
  ``--single-select-every`` (4) calls, and a single client renews it by asking with every
  other report (``?model_selection=true``) after one selection request at its start;
  ``--single-select-by-get``: by a selection request every 4th call, as before. The table
  also prints what a single client pays when it selects by a request before every call. Requests
  go to random containers (cold caches first, warm after); a share of reports is retried
  on another container (same ``request_id``). Per
  metered record and per selection: DynamoDB calls, write and read units
  (``dynamodb_costs.Meter``: computed from item sizes, transactions double), Lambda
  invocations (the aggregator's included) and dollars per million metered calls beside
  the floor. Then exactness: every label's DailyTotal equals the accepted records.
- **rate limits**: one client sends 50 % of its limit, then another 150 %, spread over all
  containers at once: 429s at 50 %, and admissions per window at 150 %.
- **hard cap**: one label reserved from every container at once, each hold settled at its
  worst case: the overshoot.
- **hot label**: one label reported from every container at once: the calls and units of a
  report (a record is its marker, shared by no other), and exactness.
"""

from __future__ import annotations

import argparse
import io
import logging
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import uuid
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynamodb_costs  # noqa: E402  (sets the layer's path and a test environment)
from dynamodb_costs import Meter, print_table, seed_scopes  # noqa: E402

from local.stack import JWT_SECRET_NAME, free_port  # noqa: E402
from price_keeper import state  # noqa: E402
from price_keeper.store import keys, tables  # noqa: E402

# us-east-1 list prices, USD per unit.
PRICE = {
    "wru": 0.625e-6,
    "rru": 0.125e-6,
    "http_api": 1.00e-6,
    "rest_api": 3.50e-6,
    "lambda_request": 0.20e-6,
    "gb_second": 0.0000133334,
}
FLOOR_SINGLE = (1 * PRICE["wru"] + PRICE["http_api"] + PRICE["lambda_request"]) * 1e6  # $ per M calls
FLOOR_BATCHED = (1 * PRICE["wru"] + (PRICE["http_api"] + PRICE["lambda_request"]) / 100) * 1e6
# Lambda duration is not measurable on moto (its latency is not DynamoDB's): 10 ms per
# DynamoDB call made one after another (calls a thread pool makes at once count once) plus
# 5 ms, at the stack's memory sizes (docs/infrastructure.md).
MS_PER_CALL, MS_BASE = 10, 5
HTTP_GB, AGGREGATOR_GB = 0.5, 1.0
LABELS = ("premium", "standard", "economy")
RETRIES_5XX = 3
# How long a transaction holds its items on the benchmark's endpoint (``moto_patches``): about
# a TransactWriteItems' own latency on DynamoDB, so concurrent transactions (the fold's, a
# label-day's first records') conflict as they would there.
TRANSACTION_HOLD_MS = 10.0


# --- the DynamoDB endpoint ------------------------------------------------------------


def _serve(port: int, ready, transaction_hold_ms: float, stream_shards: int = 1) -> None:
    """The moto server process, patched as the local stack runs it (``local/moto_patches.py``:
    one DynamoDB request at a time, per-item transaction rollback), and with DynamoDB's
    transaction conflicts modelled (an item a transaction touched is held that long) and its
    streams served as ``stream_shards`` shards, a record's by its partition key."""
    from moto.server import ThreadedMotoServer

    from local import moto_patches

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    moto_patches.apply(transaction_hold_ms, stream_shards)
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    ready.set()
    threading.Event().wait()  # until terminated


class Endpoint:
    """A moto server in a child process, its tables, the JWT secret and the alert bus."""

    def __init__(self, transaction_hold_ms: float = TRANSACTION_HOLD_MS, stream_shards: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        context = mp.get_context("fork")
        ready = context.Event()
        self.process = context.Process(
            target=_serve, args=(self.port, ready, transaction_hold_ms, stream_shards), daemon=True
        )
        self.process.start()
        if not ready.wait(60):
            raise RuntimeError("the moto server did not start")
        os.environ.update(
            AWS_ENDPOINT_URL=self.url, DYNAMODB_ENDPOINT_URL=self.url, JWT_SECRET_NAME=JWT_SECRET_NAME, RATE_LIMITS="on"
        )
        state.reset()
        import boto3

        from local.stack import LocalAws
        from price_keeper.aws.events import event_bus

        LocalAws(persist=False)._ensure_tables()
        boto3.client("secretsmanager").create_secret(Name=JWT_SECRET_NAME, SecretString=uuid.uuid4().hex)
        boto3.client("events").create_event_bus(Name=event_bus())

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)


# --- containers -----------------------------------------------------------------------


@dataclass
class Request:
    kind: str  # usage, usage_batch, model_selection
    shape: str  # single, batched, rate
    method: str
    path: str
    token: str
    body: dict | None = None
    query: str = ""


@dataclass
class Tally:
    """What one kind of request cost, summed."""

    requests: int = 0
    calls: Counter = field(default_factory=Counter)
    wcu: float = 0.0
    rcu: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    # the calls one after another, what Lambda bills the duration of (the fold writes in parallel)
    sequential_calls: float = 0.0

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.calls.update(other.calls)
        self.sequential_calls += other.sequential_calls
        self.wcu += other.wcu
        self.rcu += other.rcu
        self.statuses.update(other.statuses)


def _container(inbox, outbox) -> None:
    """One Lambda container: fresh process state, then requests one at a time."""
    import json

    state.reset()
    warnings.filterwarnings("ignore", "No application metrics")
    from local import gateway

    meter = Meter()
    while (work := inbox.get()) is not None:
        tallies: dict[tuple[str, str], Tally] = defaultdict(Tally)
        replies = []
        for request in work:
            meter.reset()
            for _ in range(RETRIES_5XX + 1):  # as a client retries a 503 (a store timeout)
                reply = gateway.invoke(
                    request.method,
                    request.path,
                    headers={"Authorization": f"Bearer {request.token}", "Content-Type": "application/json"},
                    body=request.body,
                    query=request.query,
                )
                if reply["statusCode"] < 500:
                    break
            tally = tallies[request.shape, request.kind]
            tally.requests += 1
            tally.calls.update(meter.calls)
            tally.wcu += meter.wcu
            tally.rcu += meter.rcu
            tally.statuses[reply["statusCode"]] += 1
            body = json.loads(reply["body"]) if reply.get("body") else {}
            replies.append((request, reply["statusCode"], reply.get("headers") or {}, body))
        outbox.put((dict(tallies), replies))


class Fleet:
    """``size`` container processes, fed lists of requests."""

    def __init__(self, size: int):
        context = mp.get_context("fork")
        self.outbox = context.Queue()
        self.inboxes = [context.Queue() for _ in range(size)]
        self.processes = [
            context.Process(target=_container, args=(inbox, self.outbox), daemon=True) for inbox in self.inboxes
        ]
        for process in self.processes:
            process.start()

    def run(self, work: list[list[Request]]) -> tuple[dict[tuple[str, str], Tally], list]:
        """Each container's list, all containers at once; the tallies and every reply."""
        busy = 0
        for inbox, requests in zip(self.inboxes, work, strict=True):
            if requests:
                inbox.put(requests)
                busy += 1
        tallies: dict[tuple[str, str], Tally] = defaultdict(Tally)
        replies = []
        for _ in range(busy):
            got, answered = self.outbox.get()
            for key, tally in got.items():
                tallies[key].add(tally)
            replies += answered
        return tallies, replies

    def stop(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(30)


# --- the aggregator -------------------------------------------------------------------


class Aggregator:
    """The stream mapping and the aggregator function, in this process, counted."""

    def __init__(self):
        from local.streams import StreamReader, StreamTrigger

        self.meter = Meter()
        self.invocations = self.records = 0
        self.sequential = 0  # the invocations' calls one after another (``sequential_calls``)
        self.shape_of: dict[str, str] = {}  # org id -> its tenant's shape
        self.by_shape: dict[str, Tally] = defaultdict(Tally)  # the fold's work, by the shapes it folded
        self.polls_begun = 0
        self.empty_poll = -1  # the number of the last poll that found nothing to read or deliver
        self.stop_event = threading.Event()
        aggregator = self

        class Counted(StreamTrigger):
            read_now = 0

            def _poll(self):
                number, aggregator.polls_begun = aggregator.polls_begun, aggregator.polls_begun + 1
                self.read_now = 0
                super()._poll()  # reads, then delivers what is due (retries included) before returning
                if not self.read_now and not any(self.pending.values()):
                    aggregator.empty_poll = number

            def _deliver(self, shard_id, batch):  # one invocation, or more when a reply names failed records
                meter = aggregator.meter
                before = (Counter(meter.calls), meter.wcu, meter.rcu, Counter(meter.by_thread), aggregator.invocations)
                delivered = super()._deliver(shard_id, batch)
                aggregator.attribute(batch, *before)
                return delivered

        class CountedReader(StreamReader):
            def read(self):
                records = super().read()
                trigger.read_now += sum(map(len, records.values()))
                return records

        import local.streams

        deliver = local.streams.invoke_job

        def invoked(function: str, event: dict):
            aggregator.invocations += 1
            aggregator.records += len(event["Records"])
            return deliver(function, event)

        self.uncounted = deliver
        local.streams.invoke_job = invoked  # this process is the mapping: each invocation counted
        trigger = Counted("aggregator", CountedReader(tables.USAGE_AGG_SHARDED), self.stop_event)
        self.trigger = trigger
        sys.stdout = _Unless(self.trigger, sys.stdout)  # its metrics (EMF lines) not printed
        self.trigger.start()

    def attribute(
        self, batch: list[dict], calls: Counter, wcu: float, rcu: float, by_thread: Counter, invocations: int
    ) -> None:
        """Share what folding ``batch`` cost among the tenant shapes by the label-days each
        had in it (a fold's work is per changed label-day, whatever its records): a batched
        client's 100 records of a label fold at the price of one, a single client's record
        alone at the price of one too. The label-days are those the aggregator folds
        (``ledger.changes``: the markers' changes)."""
        from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

        from price_keeper.domain import ledger

        records = list(DynamoDBStreamEvent({"Records": batch}).records)
        changed = {label_day for change in ledger.changes(records) for label_day in change.label_days}
        shapes = Counter(self.shape_of.get(keys.split_scope(usage_key)[0], "other") for usage_key, _ in changed)
        spent = Counter(self.meter.calls)
        spent.subtract(calls)
        sequential = self.sequential_calls(by_thread)
        self.sequential += sequential
        label_days = sum(shapes.values())
        for shape, count in shapes.items():
            share = count / label_days
            tally = self.by_shape[shape]
            tally.requests += share * (self.invocations - invocations)  # the shape's share of the invocations
            tally.calls.update({name: n * share for name, n in spent.items()})
            tally.sequential_calls += sequential * share
            tally.wcu += (self.meter.wcu - wcu) * share
            tally.rcu += (self.meter.rcu - rcu) * share

    def sequential_calls(self, before: Counter) -> int:
        """The calls of the invocations that just ran, one after another: those of the
        invoking thread and, for each thread pool it waited on (reads of over 100 keys, pages
        queried at once), its busiest thread's. Lambda bills the wall-clock time."""
        made = Counter(self.meter.by_thread)
        made.subtract(before)
        invoking = made.pop(threading.current_thread().name, 0)
        busiest: dict[str, int] = {}
        for thread, calls in made.items():  # a pool's threads are named "<pool>_<n>"
            pool = thread.rpartition("_")[0] or thread
            busiest[pool] = max(busiest.get(pool, 0), calls)
        return invoking + sum(busiest.values())

    def drain(self, timeout_seconds: float = 900.0) -> None:
        """Return once every write made before the call is folded: a poll that began after
        the call read nothing new and left nothing pending. Deliveries happen inside a poll,
        so by then every batch read before has been folded (the trigger retries until it is)."""
        first, deadline = self.polls_begun, time.monotonic() + timeout_seconds
        while self.empty_poll < first:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stream was not drained in {timeout_seconds:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        import local.streams

        self.stop_event.set()
        self.trigger.join(10)
        local.streams.invoke_job = self.uncounted
        if isinstance(sys.stdout, _Unless):
            sys.stdout = sys.stdout.stream


class _Unless(io.TextIOBase):
    """``stream``, but what ``thread`` writes is dropped (``sys.stdout`` is the process's:
    redirecting it from one thread would swallow the others' prints too)."""

    def __init__(self, thread: threading.Thread, stream):
        self.thread, self.stream = thread, stream

    def write(self, text: str) -> int:
        return len(text) if threading.current_thread() is self.thread else self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


# --- the metering run -----------------------------------------------------------------


def _usage(label: str, request_id: str | None = None) -> dict:
    return dynamodb_costs.usage(label).model_dump() | ({"request_id": request_id} if request_id else {})


@dataclass
class Tenant:
    org_id: str
    app_id: str
    token: str
    shape: str

    @property
    def path(self) -> str:
        return f"/api/v1/orgs/{self.org_id}/apps/{self.app_id}"


def tenants(count: int, rate_limits: dict[str, int] | None = None) -> list[Tenant]:
    """``count`` orgs with one app as provisioning makes them (``dynamodb_costs.seed_scopes``;
    half of them single clients, half batched), each with an access token, and the org's own
    ``rate_limits`` (``overrides.rate_limits``) if given."""
    import boto3

    from price_keeper.domain import auth

    config = boto3.resource("dynamodb").Table(tables.CONFIG.physical_name)
    made = []
    for n, (org_id, app_id) in enumerate(seed_scopes(count)):
        if rate_limits:
            config.update_item(
                Key={"org_key": keys.org_key(org_id), "resource_key": "#"},
                UpdateExpression="SET rate_limits = :limits",
                ExpressionAttributeValues={":limits": rate_limits},
            )
        token = auth.issue_tokens(auth.Principal(org_id, app_id))["access_token"]
        made.append(Tenant(org_id, app_id, token, "single" if n % 2 == 0 else "batched"))
    return made


@dataclass
class Shape:
    """How the clients of a run call: batch size and calls per selection of each shape."""

    batch: int = 100
    select_every: int = 300
    single_select_every: int = 4
    retries: float = 0.05
    single_selects_by_get: bool = False  # as clients did before reports carried the selection

    @classmethod
    def of(cls, args) -> Shape:
        return cls(args.batch, args.select_every, args.single_select_every, args.retries, args.single_select_by_get)

    def single_selection(self, sent: int) -> str | None:
        """How a single client's ``sent``-th call selects: ``"get"`` (a selection request
        before it), ``"report"`` (its report asks for the selection) or ``None``. The client
        library GETs its first choice; from there a report asks once the choice is past half
        its life: at a call every ~86 s and a 300 s choice, every other report after the second
        (``tests/client/test_runtime_server.py``), ``single_select_every // 2`` calls apart."""
        if self.single_selects_by_get:
            return "get" if sent % self.single_select_every == 0 else None
        every = max(1, self.single_select_every // 2)
        if sent == 0:
            return "get"
        return "report" if sent >= every and sent % every == 0 else None


def metering_work(clients: list[Tenant], records: int, containers: int, shape: Shape, seed: int) -> list[list[Request]]:
    """``records`` metered calls over the clients, each request on a random container."""
    rng = random.Random(seed)
    work: list[list[Request]] = [[] for _ in range(containers)]
    per_client = max(1, records // len(clients))
    batch, select_every, retries = shape.batch, shape.select_every, shape.retries
    for tenant in clients:
        sent = 0
        while sent < per_client:
            if tenant.shape == "single":
                label = rng.choice(LABELS)
                request_id = str(uuid.uuid4())
                selects = shape.single_selection(sent)
                requests = [
                    Request(
                        "usage",
                        "single",
                        "POST",
                        f"{tenant.path}/usage",
                        tenant.token,
                        _usage(label, request_id),
                        "model_selection=true" if selects == "report" else "",
                    ),
                ]
                if selects == "get":
                    requests.insert(
                        0, Request("model_selection", "single", "GET", f"{tenant.path}/model-selection", tenant.token)
                    )
                if rng.random() < retries:  # the client did not see the answer and retries elsewhere
                    requests.append(requests[-1])
                sent += 1
            else:
                size = min(batch, per_client - sent)
                body = {"requests": [_usage(rng.choice(LABELS)) for _ in range(size)]}
                requests = [Request("usage_batch", "batched", "POST", f"{tenant.path}/usage/batch", tenant.token, body)]
                if sent % select_every < size or sent == 0:
                    requests.insert(
                        0, Request("model_selection", "batched", "GET", f"{tenant.path}/model-selection", tenant.token)
                    )
                sent += size
            for request in requests:
                work[rng.randrange(containers)].append(request)
    for requests in work:
        rng.shuffle(requests)
    return work


def opening_work(clients: list[Tenant], containers: int, seed: int) -> list[list[Request]]:
    """One report of each label of each tenant, each on a random container: the day's
    first record of every label-day, which lists it (its index entry, in a transaction with
    the marker) and creates its total (the fold's first write). At fleet shape a label-day gets ~330 reports a
    day, so these writes are noise there; the measured phases must not count them in."""
    rng = random.Random(seed)
    work: list[list[Request]] = [[] for _ in range(containers)]
    for tenant in clients:
        for label in LABELS:
            usage = _usage(label, str(uuid.uuid4()))
            work[rng.randrange(containers)].append(
                Request("usage", tenant.shape, "POST", f"{tenant.path}/usage", tenant.token, usage)
            )
    return work


def accepted_records(replies: list) -> dict[tuple[str, str, str], dict[str, int]]:
    """(org, app, label) -> {request_id: cost} of every accepted record, from the replies.
    A single report's cost is not in its receipt: it is taken from a batch record of the
    same label (the same tokens and prices), filled in by ``exactness``."""
    accepted: dict[tuple[str, str, str], dict[str, int]] = defaultdict(dict)
    for request, status, _, body in replies:
        org_id, app_id = request.path.split("/")[4], request.path.split("/")[6]
        if request.kind == "usage" and status == 202:
            accepted[org_id, app_id, request.body["model_label"]][request.body["request_id"]] = -1
        elif request.kind == "usage_batch" and status == 207:
            for record, result in zip(request.body["requests"], body["results"], strict=True):
                if result["status"] == "accepted":
                    accepted[org_id, app_id, record["model_label"]][record["request_id"]] = result["cost_usd_micros"]
    return accepted


def carried_selections(replies: list) -> list[str]:
    """Every report that asked for the selection (``?model_selection=true``) got one: the
    reports that carried none (none: as the client library relies on)."""
    return [
        f"{request.path}: {status}, no selection carried"
        for request, status, _, body in replies
        if request.query and not (status == 202 and isinstance(body.get("model_selection"), dict))
    ]


def exactness(replies: list) -> list[str]:
    """Every accepted record counted once: each label's DailyTotal equals the accepted
    records' count and cost. The problems found (none: exact)."""
    from datetime import UTC, datetime

    from price_keeper.store import daily_totals
    from price_keeper.timeutil import org_day

    accepted = accepted_records(replies)
    unit_cost = {label: cost for (_, _, label), ids in accepted.items() for cost in ids.values() if cost >= 0}
    day = org_day(dynamodb_costs.TZ, datetime.now(UTC))
    problems = []
    for (org_id, app_id, label), ids in accepted.items():
        expected_cost = sum(cost if cost >= 0 else unit_cost[label] for cost in ids.values())
        scope = keys.scope_key(org_id, app_id, "APP")
        usage_key = keys.usage_key(scope, label)
        total = daily_totals.read_days([(usage_key, day)]).get((usage_key, day), {})
        seen = (int(total.get("cost_usd_micros", 0)), int(total.get("requests", 0)))
        if seen != (expected_cost, len(ids)):
            problems.append(f"{org_id}/{label}: total, requests {seen}; accepted {expected_cost}, {len(ids)}")
    return problems


def dollars(calls_per_record: dict[str, float], wcu: float, rcu: float, invocations: float, gb_s: float, api: str):
    return (
        wcu * PRICE["wru"]
        + rcu * PRICE["rru"]
        + calls_per_record["http"] * PRICE[api]
        + invocations * PRICE["lambda_request"]
        + gb_s * PRICE["gb_second"]
    ) * 1e6


@dataclass
class Spent:
    """What a shape's records took, the aggregator's share included: requests (each one
    API Gateway and one Lambda request), DynamoDB calls and units."""

    http: float
    calls: float
    wcu: float
    rcu: float
    fold_invocations: float
    fold_calls: float
    fold_sequential_calls: float  # the fold's calls one after another (its duration)

    def plus(self, requests: Tally, times: float) -> Spent:
        """These records' spend with ``times`` more (or fewer) of ``requests``' requests."""
        return Spent(
            http=self.http + times * requests.requests,
            calls=self.calls + times * sum(requests.calls.values()),
            wcu=self.wcu + times * requests.wcu,
            rcu=self.rcu + times * requests.rcu,
            fold_invocations=self.fold_invocations,
            fold_calls=self.fold_calls,
            fold_sequential_calls=self.fold_sequential_calls,
        )

    def row(self, client: str, n: int, floor: float) -> tuple:
        """The all-in table's row for ``n`` records."""
        request_calls = self.calls - self.fold_calls
        gb_s = (request_calls * MS_PER_CALL + self.http * MS_BASE) / 1000 * HTTP_GB + (
            self.fold_sequential_calls * MS_PER_CALL + self.fold_invocations * MS_BASE
        ) / 1000 * AGGREGATOR_GB
        per = {"http": self.http / n}
        invocations = (self.http + self.fold_invocations) / n
        http_api = dollars(per, self.wcu / n, self.rcu / n, invocations, gb_s / n, "http_api")
        rest_api = dollars(per, self.wcu / n, self.rcu / n, invocations, gb_s / n, "rest_api")
        return (
            client,
            n,
            f"{self.calls / n:.2f}",
            f"{self.wcu / n:.2f}",
            f"{self.rcu / n:.2f}",
            f"{invocations:.3f}",
            f"${rest_api:.2f}",
            f"${http_api:.2f}",
            f"${floor:.3f}",
            f"{http_api / floor:.1f}x",
        )


def _per(calls: Counter, requests: int) -> str:
    """Calls per request by operation, initials (``TWI 1.00, BGI 2.10``)."""
    initials = {name: "".join(c for c in name if c.isupper()) for name in calls}
    return ", ".join(f"{initials[name]} {count / requests:.2f}" for name, count in calls.most_common())


def report(
    tallies: dict[tuple[str, str], Tally], aggregator: Aggregator, replies: list, selects_by_get: bool = False
) -> list[tuple]:
    """Per metered record and per selection, for each client shape: the table rows. When
    single clients renew their choice with their reports, their only selection requests are
    their first: the row past it is what an app calling all day pays (its one request a day
    is noise among ~1,000 calls; here it is one in 10)."""
    records = Counter()
    for request, status, _, body in replies:
        if request.kind == "usage" and status == 202 and not body.get("duplicate"):
            records[request.shape] += 1
        elif request.kind == "usage_batch" and status == 207:
            records[request.shape] += sum(
                1 for r in body["results"] if r["status"] == "accepted" and not r["duplicate"]
            )
    fold_calls = sum(aggregator.meter.calls.values())
    rows = []
    for (shape, kind), tally in sorted(tallies.items()):
        calls = sum(tally.calls.values())
        rows.append(
            (
                f"{shape}: {kind}",
                tally.requests,
                f"{calls / tally.requests:.2f}",
                f"{tally.wcu / tally.requests:.2f}",
                f"{tally.rcu / tally.requests:.2f}",
                _per(tally.calls, tally.requests),
                dict(tally.statuses),
            )
        )
    batches = max(1, aggregator.invocations)
    rows.append(
        (
            f"aggregator: stream batch ({aggregator.records / batches:.1f} records,"
            f" {aggregator.sequential / batches:.1f} calls in sequence)",
            aggregator.invocations,
            f"{fold_calls / batches:.2f}",
            f"{aggregator.meter.wcu / batches:.2f}",
            f"{aggregator.meter.rcu / batches:.2f}",
            _per(aggregator.meter.calls, batches),
            "",
        )
    )
    costs = []
    for shape in ("single", "batched"):
        mine = {kind: tally for (s, kind), tally in tallies.items() if s == shape}
        if not records[shape]:
            continue
        n = records[shape]
        folds = aggregator.by_shape[shape]  # the aggregator's work, by the label-days it folded
        spent = Spent(
            http=sum(t.requests for t in mine.values()),
            calls=sum(sum(t.calls.values()) for t in mine.values()) + sum(folds.calls.values()),
            wcu=sum(t.wcu for t in mine.values()) + folds.wcu,
            rcu=sum(t.rcu for t in mine.values()) + folds.rcu,
            fold_invocations=folds.requests,
            fold_calls=sum(folds.calls.values()),
            fold_sequential_calls=folds.sequential_calls,
        )
        costs.append(spent.row(shape, n, FLOOR_SINGLE if shape == "single" else FLOOR_BATCHED))
        selections = mine.get("model_selection")
        if shape == "single" and selections:  # the same clients, selecting before every call
            every_call = spent.plus(selections, (n - selections.requests) / selections.requests)
            costs.append(every_call.row("single, selecting before every call", n, FLOOR_SINGLE))
        if shape == "single" and selections and not selects_by_get:  # an app calling all day
            past_start = spent.plus(selections, -1)
            costs.append(past_start.row("single, past each client's first selection", n, FLOOR_SINGLE))
    print_table(
        "Per request (DynamoDB units computed from item sizes)",
        ("request", "count", "calls", "WRU", "RRU", "calls by operation", "statuses"),
        rows,
    )
    print_table(
        "All-in per metered record (the fold's work shared by the label-days folded), $ per million metered calls",
        ("client", "records", "calls", "WRU", "RRU", "Lambda inv.", "REST", "HTTP API", "floor", "HTTP/floor"),
        costs,
    )
    return costs


# The metering run's tenants are fleet-sized: their orgs raise the per-client limits (the
# harness sends a client's calls faster than the configured 120 a minute).
FLEET_TENANT_LIMITS = {"usage": 100_000, "usage_batch": 10_000, "model_selection": 100_000}


def metering_run(fleet: Fleet, args) -> tuple[list[tuple], list[str]]:
    clients = tenants(args.tenants, FLEET_TENANT_LIMITS)
    aggregator = Aggregator()
    aggregator.shape_of = {tenant.org_id: tenant.shape for tenant in clients}
    aggregator.meter.reset()
    # the day's first record of every label-day, then every container's first requests
    # (config, prices, token checks), then warm
    _, opening_replies = fleet.run(opening_work(clients, args.containers, 0))
    aggregator.drain()
    cold, cold_replies = fleet.run(metering_work(clients, args.records // 10, args.containers, Shape.of(args), 1))
    aggregator.drain()
    cold_batches = aggregator.invocations
    aggregator.meter.reset()
    aggregator.by_shape.clear()
    aggregator.invocations = aggregator.records = 0
    tallies, replies = fleet.run(metering_work(clients, args.records, args.containers, Shape.of(args), 2))
    aggregator.drain()
    aggregator.stop()
    print(f"cold phase: {sum(t.requests for t in cold.values())} requests, {cold_batches} stream batches; warm below")
    costs = report(tallies, aggregator, replies, args.single_select_by_get)
    everything = opening_replies + cold_replies + replies
    return costs, exactness(everything) + carried_selections(cold_replies + replies)


# --- the rate-limit run ---------------------------------------------------------------


def rate_limit_run(fleet: Fleet, containers: int, limit: int, seed: int = 3) -> dict[str, tuple]:
    """One client at 50 % of its limit, another at 150 %, each spread over all containers
    at once (model selection, the org's own limit ``limit`` a minute). Per load:
    (requests, 429s, the most admitted in one window, rate-limit writes per request)."""

    rng = random.Random(seed)
    results = {}
    for load in (0.5, 1.5):
        client = tenants(1, {"model_selection": limit})[0]
        sent = int(limit * load)
        _wait_for_a_fresh_window(seconds_needed=45)
        work: list[list[Request]] = [[] for _ in range(containers)]
        for n in range(sent):  # every container gets some, then the rest at random
            target = n if n < containers else rng.randrange(containers)
            work[target].append(
                Request("model_selection", "rate", "GET", f"{client.path}/model-selection", client.token)
            )
        tallies, replies = fleet.run(work)
        leases = sum(tally.calls["UpdateItem"] for tally in tallies.values())
        admitted_per_window = Counter(
            headers.get("X-RateLimit-Reset") for _, status, headers, _ in replies if status == 200
        )
        refused = sum(1 for _, status, _, _ in replies if status == 429)
        most = max(admitted_per_window.values(), default=0)
        results[f"{int(load * 100)} %"] = (sent, refused, most, f"{leases / sent:.2f}")
    return results


def reservation_run(fleet: Fleet, containers: int, per_container: int = 8, quota: int = 300_000) -> tuple:
    """The hard cap across containers: one client's reservations of its premium label, sent
    by every container at once against a quota that binds, then each granted hold
    settled at its worst case. (reservations asked, granted, the quota, spend settled,
    overshoot, one call's worst case)."""
    import boto3

    client = tenants(1)[0]
    boto3.resource("dynamodb").Table(tables.CONFIG.physical_name).update_item(
        Key={"org_key": keys.org_key(client.org_id), "resource_key": "#"},
        UpdateExpression="SET quotas.premium = :quota",
        ExpressionAttributeValues={":quota": quota},
    )
    call = _usage("premium")
    hold = {
        "max_input_tokens": call["input_tokens"],
        "max_output_tokens": call["output_tokens"],
        "model_label": "premium",
    }
    reserve = Request("reservations", "reserving", "POST", f"{client.path}/reservations", client.token, hold)
    _, replies = fleet.run([[reserve] * per_container for _ in range(containers)])
    granted = [body for _, status, _, body in replies if status == 201]
    settle: list[list[Request]] = [[] for _ in range(containers)]
    for n, held in enumerate(granted):
        body = _usage(held["label"]) | {"reservation_id": held["reservation_id"]}
        settle[n % containers].append(Request("usage", "reserving", "POST", f"{client.path}/usage", client.token, body))
    _, settled = fleet.run(settle)
    spend = sum(body["processing"]["cost_usd_micros"] for _, status, _, body in settled if status == 202)
    worst = max((held["amount_usd_micros"] for held in granted), default=0)
    return len(replies), len(granted), quota, spend, max(0, spend - quota), worst


def hot_label_run(fleet: Fleet, containers: int, per_container: int) -> tuple:
    """One client's one label reported singly from every container at once: a hot label-day.
    A record is its marker, shared by no other: only a container's first record of the
    label-day (which lists it) is a transaction, and those conflict on the index entry (on
    this endpoint as on DynamoDB). (reports, accepted, DynamoDB calls, write and read units,
    TransactWriteItems a report, the exactness problems.)"""
    client = tenants(1, FLEET_TENANT_LIMITS)[0]
    path, token = client.path, client.token
    aggregator = Aggregator()
    # a batch record first: ``exactness`` takes a single report's cost from one of its label
    _, priced = fleet.run(
        [[Request("usage_batch", "hot", "POST", f"{path}/usage/batch", token, {"requests": [_usage("premium")]})]]
        + [[] for _ in range(containers - 1)]
    )
    reports = [
        [
            Request("usage", "hot", "POST", f"{path}/usage", token, _usage("premium", str(uuid.uuid4())))
            for _ in range(per_container)
        ]
        for _ in range(containers)
    ]
    tallies, replies = fleet.run(reports)
    aggregator.drain()
    aggregator.stop()
    tally = tallies["hot", "usage"]
    return (
        tally.requests,
        tally.statuses[202],
        round(sum(tally.calls.values()) / tally.requests, 2),
        round(tally.wcu / tally.requests, 2),
        round(tally.rcu / tally.requests, 2),
        round(tally.calls["TransactWriteItems"] / tally.requests, 2),
        exactness(priced + replies),
    )


def _wait_for_a_fresh_window(seconds_needed: int) -> None:
    """Start a burst early in a minute, so it falls in one window (the check groups by
    window anyway: a burst split in two is only a weaker test)."""
    into = time.time() % 60
    if into > 60 - seconds_needed:
        time.sleep(60 - into + 0.5)


def print_rate_limits(results: dict[str, tuple], containers: int, limit: int) -> None:
    print_table(
        f"Rate limits: one client over {containers} containers, limit {limit}/min (its org's)",
        ("load", "requests", "429s", "most admitted in one window", "lease writes per request"),
        [(load, *values) for load, values in results.items()],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=6)
    parser.add_argument("--tenants", type=int, default=8, help="orgs with one app and three labels")
    parser.add_argument("--records", type=int, default=1600, help="metered calls in the warm phase")
    parser.add_argument("--batch", type=int, default=100, help="records per batch of the batched clients")
    parser.add_argument("--select-every", type=int, default=300, help="calls per selection of the batched clients")
    parser.add_argument(
        "--single-select-every",
        type=int,
        default=4,
        help="calls per lifetime of a single client's choice (1: it selects before every call)",
    )
    parser.add_argument(
        "--single-select-by-get",
        action="store_true",
        help="single clients select by a request of their own, as before reports carried the selection",
    )
    parser.add_argument("--retries", type=float, default=0.05, help="share of single reports sent twice")
    parser.add_argument("--rate-containers", type=int, default=24)
    parser.add_argument("--rate-limit", type=int, default=600, help="the client's limit a minute (its org's)")
    parser.add_argument("--rate-limits-only", action="store_true")
    parser.add_argument("--metering-only", action="store_true")
    parser.add_argument(
        "--transaction-ms",
        type=float,
        default=TRANSACTION_HOLD_MS,
        help="how long a transaction holds its items, for conflicts (0: moto's serial order, none)",
    )
    args = parser.parse_args()
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    endpoint = Endpoint(args.transaction_ms)
    try:
        if not args.rate_limits_only:
            fleet = Fleet(args.containers)
            try:
                _, problems = metering_run(fleet, args)
            finally:
                fleet.stop()
            print("\nexactness:", "every accepted record counted once" if not problems else problems)
        if args.metering_only:
            return
        fleet = Fleet(args.rate_containers)
        try:
            results = rate_limit_run(fleet, args.rate_containers, args.rate_limit)
        finally:
            fleet.stop()
        print_rate_limits(results, args.rate_containers, args.rate_limit)
        fleet = Fleet(args.rate_containers)
        try:
            reserved = reservation_run(fleet, args.rate_containers)
        finally:
            fleet.stop()
        print_table(
            f"Hard cap: one client's premium label reserved from {args.rate_containers} containers at once",
            ("reservations", "granted", "quota", "spend settled", "overshoot", "one call's worst case"),
            [reserved],
        )
        fleet = Fleet(args.rate_containers)
        try:
            *hot, problems = hot_label_run(fleet, args.rate_containers, per_container=25)
        finally:
            fleet.stop()
        print_table(
            f"Hot label: one client's premium label reported singly from {args.rate_containers} containers at once",
            (
                "reports",
                "accepted",
                "calls a report",
                "WRU",
                "RRU",
                "TransactWriteItems",
                "exactness",
            ),
            [(*hot, "every accepted record counted once" if not problems else problems)],
        )
    finally:
        endpoint.stop()


if __name__ == "__main__":
    main()
