"""Overshoot near the limit: how much clients spend on a label past its quota before model
selection moves them off it, with DailyTotal refreshed by the fold of the usage table's stream.

Everything runs on moto in-process with a simulated clock (no sleeping). Clients call
Bedrock one call at a time: before each call they ask model selection (the real
``selection.select_model``: DailyTotals, and the live items in tight mode) — or, with
``cached``, ``price_keeper_client``'s own ``ModelSelector`` (the service's cache guidance,
dropped when a usage answer shows the label spent or its mode changed) — and after it they
report the usage (the real ``metering.submit``, whose answer carries the label's
``daily_total``). The aggregator runs as deployed, on the same clock: every
``BATCHING_WINDOW`` s the records the usage table's stream gained are read
(``local.streams.StreamReader``) and handed to the aggregator's fold (``ledger.fold_batch``)
``DELIVERY`` s later (the event source mapping's polling and the invocation), so a write
reaches DailyTotal 0.5-1.5 s after it is made. PHASE offsets the burst within the window.

Scenarios:
- ``cold``: one client at 20 calls/s, spend 0 when the burst starts, $2 quota.
- ``warm``: the same, earlier calls already aggregated at 96 % (tight) of the quota.
- ``4 clients``: the acceptance case: four clients, 5 calls/s each, $4 quota.
- ``4 clients, cached``: the same with the client library's cached selection.
- ``total cap, cached``: four cached clients, 5 calls/s each, premium's quota 50 x a $4
  total cap (``total_quota_usd_micros``): the total cap is what stops them (429), which
  the clients learn from the usage answers' ``scope_total``; ``... label only``
  is the client before that, which heard only the label's position (it kept its cached
  NORMAL choice for up to 300 s while the cap was passed).

Every call is a 3,760 micro-USD premium call (1,500 input + 800 output tokens).

Run: ``.venv/bin/python benchmarks/overshoot.py [name part]`` (about 3 minutes on 2 cores for all).
"""

from __future__ import annotations

import heapq
import itertools
import os
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "client")]
import dynamodb_costs  # noqa: E402, F401 (on import: the layer on sys.path and moto's environment)

os.environ["RATE_LIMITS"] = "off"

import boto3  # noqa: E402
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent  # noqa: E402
from moto import mock_aws  # noqa: E402

from local import moto_patches  # noqa: E402
from local.streams import StreamReader  # noqa: E402
from price_keeper import state  # noqa: E402
from price_keeper.bodies import UsageRequest  # noqa: E402
from price_keeper.config import get_config  # noqa: E402
from price_keeper.domain import ledger, metering, selection  # noqa: E402
from price_keeper.errors import ApiError  # noqa: E402
from price_keeper.store import keys  # noqa: E402
from price_keeper.store.dynamo import table  # noqa: E402
from price_keeper.store.tables import ALL_TABLES, CONFIG, USAGE_AGG_SHARDED  # noqa: E402
from price_keeper_client.models import LabelQuota, ModelChoice, ScopeTotal  # noqa: E402
from price_keeper_client.selection import ModelSelector  # noqa: E402
from tests.factories import seed_app, seed_org  # noqa: E402

BATCHING_WINDOW = 1.0  # aggregation.USAGE_STREAM.batching_window_s
DELIVERY = 0.5  # from the window's end to the fold's writes: polling, invocation, the fold itself
CALL = {"input_tokens": 1500, "output_tokens": 800}  # premium: 3,760 micro-USD a call
MAX_SECONDS = 600
START = datetime(2026, 6, 10, 12, 0, tzinfo=UTC)  # mid-day for a UTC org
ORDERING = ("premium", "standard")


@dataclass(frozen=True)
class Scenario:
    name: str
    clients: int
    seconds_per_call: float
    quota_usd_micros: int
    start_pct: int = 0
    cached: bool = False
    total_cap: bool = False  # the quota is the scope's total cap; premium's own is 50 x it
    observe_total: bool = True  # the cached client hears the usage answers' scope_total


SCENARIOS = (
    Scenario("cold", 1, 0.05, 2_000_000),
    Scenario("warm", 1, 0.05, 2_000_000, start_pct=96),
    Scenario("4 clients", 4, 0.2, 4_000_000),
    Scenario("4 clients, cached", 4, 0.2, 4_000_000, cached=True),
    Scenario("total cap, cached", 4, 0.2, 4_000_000, cached=True, total_cap=True),
    Scenario("total cap, label only", 4, 0.2, 4_000_000, cached=True, total_cap=True, observe_total=False),
)
PHASES = (0.0, 0.5)


@dataclass
class Result:
    overshoot_usd_micros: int
    calls_past_quota: int
    seconds_to_move: float
    selections: int


def fold(event: dict, now) -> None:
    """A stream shard's batch folded as the aggregator folds it."""
    ledger.fold_batch(DynamoDBStreamEvent(event).records, event["shardId"], now)


def _fresh_store() -> None:
    state.reset()
    ddb = boto3.client("dynamodb")
    for spec in ALL_TABLES:
        ddb.create_table(**spec.create_table_kwargs())


def _usage(now: datetime, **tokens) -> UsageRequest:
    return UsageRequest(
        request_id=str(uuid.uuid4()),
        model_label="premium",
        bedrock_model_id="amazon.nova-pro-v1:0",
        input_tokens=tokens.get("input_tokens", 0),
        output_tokens=tokens.get("output_tokens", 0),
        status="OK",
        timestamp=now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )


class Clock:
    def __init__(self):
        self.seconds = 0.0

    @property
    def now(self) -> datetime:
        return START + timedelta(seconds=self.seconds)


def run(scenario: Scenario, phase: float) -> Result:
    moto_patches.apply()  # serialised, per-item transaction rollback
    with mock_aws():
        _fresh_store()
        quota = scenario.quota_usd_micros
        org_id = seed_org(
            quota_scope="APP",
            timezone="UTC",
            model_ordering=ORDERING,
            quotas={"premium": (50 if scenario.total_cap else 1) * quota, "standard": 50 * quota},
        )
        if scenario.total_cap:
            table(CONFIG).update_item(
                Key={"org_key": keys.org_key(org_id), "resource_key": keys.ROOT_RESOURCE},
                UpdateExpression="SET total_quota_usd_micros = :cap",
                ExpressionAttributeValues={":cap": quota},
            )
        seed_app(org_id, "bench")
        clock = Clock()
        stream = StreamReader(USAGE_AGG_SHARDED)
        spent = 0
        tokens = quota * scenario.start_pct // 100 * 10 // 8  # premium input: 0.8 micro-USD a token
        while tokens > 0:  # earlier calls (within the per-record token cap), aggregated before the burst
            chunk = min(tokens, get_config().metering.max_input_tokens)
            spent += metering.submit(org_id, "bench", _usage(clock.now, input_tokens=chunk), clock.now)["processing"][
                "cost_usd_micros"
            ]
            tokens -= chunk
        fold(stream.event(), clock.now)  # folded before the burst
        selections = 0

        def fetch(force: bool):
            nonlocal selections
            selections += 1
            body, headers = selection.select_model(org_id, "bench", force, clock.now)
            return ModelChoice.from_json(body), headers.get("Cache-Control")

        events, order = [], itertools.count()

        def at(seconds: float, kind: str, payload=None) -> None:
            heapq.heappush(events, (seconds, next(order), kind, payload))

        at(BATCHING_WINDOW - phase, "window")
        selectors = [ModelSelector(fetch, clock=lambda: clock.seconds) for _ in range(scenario.clients)]
        for client in range(scenario.clients):
            at(client * scenario.seconds_per_call / scenario.clients, "call", client)
        active, past_quota, moved_at = set(range(scenario.clients)), 0, 0.0
        while active and events:
            clock.seconds, _, kind, payload = heapq.heappop(events)
            if clock.seconds > MAX_SECONDS:
                break
            if kind == "window":
                at(clock.seconds + DELIVERY, "fold", stream.event())
                at(clock.seconds + BATCHING_WINDOW, "window")
            elif kind == "fold":
                if payload["Records"]:
                    fold(payload, clock.now)
            elif kind == "call":  # the client picks a model, then calls it
                try:
                    label = selectors[payload].current().label if scenario.cached else fetch(False)[0].label
                except ApiError as error:  # 429: every label, or the total cap, spent
                    if error.status != 429:
                        raise
                    label = None
                if label != "premium":
                    active.discard(payload)
                    moved_at = clock.seconds
                    continue
                past_quota += spent >= quota
                at(clock.seconds + scenario.seconds_per_call, "report", payload)
            elif kind == "report":  # the call ended: report its usage, start the next call
                answer = metering.submit(org_id, "bench", _usage(clock.now, **CALL), clock.now)
                spent += answer["processing"]["cost_usd_micros"]
                selectors[payload].observe(LabelQuota.find(answer))
                if scenario.observe_total:
                    selectors[payload].observe_total(ScopeTotal.from_json(answer.get("scope_total")))
                at(clock.seconds, "call", payload)
        return Result(max(0, spent - quota), past_quota, moved_at, selections)


def _run_case(case: tuple[Scenario, float]) -> tuple[tuple[Scenario, float], Result]:
    return case, run(*case)


def main() -> None:
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # run only the scenarios whose name has this in it
    cases = [(scenario, phase) for scenario in SCENARIOS if only in scenario.name for phase in PHASES]
    print(f"3,760 micro-USD premium calls; the stream: {BATCHING_WINDOW:g} s batching window + {DELIVERY:g} s delivery")
    print(
        f"{'scenario':<21} {'clients':>7} {'calls/s':>7} {'quota $':>7} {'phase':>5} "
        f"{'overshoot µ$':>12} {'% quota':>7} {'calls past':>10} {'all moved at s':>14} {'selections':>10}"
    )
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        for (scenario, phase), result in pool.map(_run_case, cases):
            rate = scenario.clients / scenario.seconds_per_call
            print(
                f"{scenario.name:<21} {scenario.clients:>7} {rate:>7g} {scenario.quota_usd_micros / 1e6:>7g} "
                f"{phase:>5g} {result.overshoot_usd_micros:>12,} "
                f"{100 * result.overshoot_usd_micros / scenario.quota_usd_micros:>6.1f}% "
                f"{result.calls_past_quota:>10} {result.seconds_to_move:>14.2f} {result.selections:>10}",
                flush=True,
            )


if __name__ == "__main__":
    main()
