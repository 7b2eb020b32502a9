"""Overshoot near the limit: how much a burst spends on a label past its quota before
model selection moves off it, when selection reads DailyTotal only ("before") and when, in
tight mode, it reads the live usage shards ("after", ``live_spend``).

Everything runs on moto in-process with a simulated clock (no sleeping): each request of
a 20 requests/s burst asks the selection rules (``quota.decide``) which label to use,
then is metered on that label with the real exactly-once write (``metering.prepare`` +
``record``); the real aggregator (``aggregation.run``) folds the shards into DailyTotal
every 60 simulated seconds. The burst starts ``phase`` seconds after an aggregator run.
Selection is asked on every request, so the numbers are the server's reaction time (a
client that caches the decision for its refresh interval adds that on top).

Strategies:
- ``before``: spends from DailyTotal (one BatchGetItem of the ordering's labels).
- ``after``: as before; when that decision is in TIGHT mode, re-decide on ``live_spend``
  (one BatchGetItem of labels x shards).
- ``live``: always ``live_spend`` (the lower bound, at N times the read cost).

Scenarios:
- ``cold``: the day's spend is 0 when the burst starts.
- ``warm``: an earlier call, already aggregated, put the label at 96 % (tight) of its quota.
- ``cold, tight at 50 %``: as cold, with the org's ``tight_mode_threshold_pct`` lowered to 50.

Run: ``.venv/bin/python benchmarks/overshoot.py``
"""
from __future__ import annotations

import os
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "layers" / "common" / "python"), str(ROOT)]
for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                    "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_DISABLED": "true",
                    "POWERTOOLS_LOG_LEVEL": "ERROR", "RATE_LIMITS": "off", "BCRYPT_ROUNDS": "4"}.items():
    os.environ[name] = value
for name in ("AWS_ENDPOINT_URL", "DYNAMODB_ENDPOINT_URL", "AWS_PROFILE"):
    os.environ.pop(name, None)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from price_keeper import aggregation, keys, metering, orgs, state  # noqa: E402
from price_keeper.aggregation import read_daily_totals  # noqa: E402
from price_keeper.config import get_config  # noqa: E402
from price_keeper.store.usage import label_spends as live_spend  # noqa: E402
from price_keeper.models import UsageRequest  # noqa: E402
from price_keeper.quota import TIGHT, decide  # noqa: E402
from price_keeper.tables import ALL_TABLES  # noqa: E402
from tests.factories import seed_app, seed_org  # noqa: E402
from tests.moto_support import serialized_moto  # noqa: E402

RATE_PER_SECOND = 20
AGGREGATION_INTERVAL = 60
QUOTA_USD_MICROS = 2_000_000  # premium: $2 a day
SHARDS = 8
CALL = {"input_tokens": 1500, "output_tokens": 800}  # premium: 3,760 micro-USD a call
MAX_BURST_SECONDS = 300
PHASES = (0, 20, 40)
START = datetime(2026, 6, 10, 12, 0, tzinfo=timezone.utc)  # a day in the middle of a UTC org's day
ORDERING = ("premium", "standard")


@dataclass
class Result:
    overshoot_usd_micros: int
    requests_past_quota: int
    seconds_to_move: float
    read_units_per_selection: float


def _fresh_store() -> None:
    state.reset()
    ddb = boto3.client("dynamodb")
    for spec in ALL_TABLES:
        ddb.create_table(**spec.create_table_kwargs())


def _meter(config, label: str, now: datetime, **tokens) -> int:
    request = UsageRequest(request_id=str(uuid.uuid4()), model_label=label, bedrock_model_id="bench",
                           input_tokens=tokens.get("input_tokens", 0), output_tokens=tokens.get("output_tokens", 0),
                           status="OK", timestamp=now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    return metering.record(metering.prepare(config, request, now), now).cost_usd_micros


def _select(strategy: str, config, day: str) -> tuple[str | None, int]:
    """(label, items read) under a reading strategy."""
    labels = config.model_ordering
    usage_keys = [keys.usage_key(config.scope, label) for label in labels]

    def choose(spends):
        return decide(labels, config.quotas, spends, config.tight_mode_threshold_pct, False, None)

    if strategy == "live":
        return choose(live_spend(config.scope, labels, day, config.agg_shard_count)).label, len(labels) * SHARDS
    totals = read_daily_totals(usage_keys, day)
    decision = choose({label: totals.of(key).cost_usd_micros for label, key in zip(labels, usage_keys)})
    if strategy == "after" and decision.mode == TIGHT:
        live = live_spend(config.scope, labels, day, config.agg_shard_count)
        return choose(live).label, len(labels) + len(labels) * SHARDS
    return decision.label, len(labels)


def run(strategy: str, scenario: str, phase: int) -> Result:
    with mock_aws(), serialized_moto():  # per-item transaction rollback: see tests/moto_support.py
        _fresh_store()
        threshold = 50 if "50" in scenario else 95
        org_id = seed_org(quota_scope="APP", timezone="UTC", model_ordering=ORDERING, agg_shard_count=SHARDS,
                          quotas={"premium": QUOTA_USD_MICROS, "standard": 50 * QUOTA_USD_MICROS},
                          tight_mode_threshold_pct=threshold)
        seed_app(org_id, "bench")
        config = orgs.effective_config(org_id, "bench")
        day = START.strftime("%Y%m%d")
        if scenario == "warm":  # earlier calls, aggregated before the burst: 96 % of the quota
            tokens = QUOTA_USD_MICROS * 96 // 100 * 10 // 8  # premium input: 0.8 micro-USD a token
            cap = get_config().token_caps("premium")[0]  # a record over the label's cap is refused
            for chunk in range(0, tokens, cap):
                _meter(config, "premium", START - timedelta(seconds=30), input_tokens=min(cap, tokens - chunk))
        aggregation.run(START)
        next_run = START + timedelta(seconds=AGGREGATION_INTERVAL)
        spent = int(live_spend(config.scope, ["premium"], day, SHARDS)["premium"])
        past_quota, reads, selections = 0, 0, 0
        step = timedelta(seconds=1 / RATE_PER_SECOND)
        now = START + timedelta(seconds=phase)
        while now < START + timedelta(seconds=phase + MAX_BURST_SECONDS):
            while now >= next_run:
                aggregation.run(next_run)
                next_run += timedelta(seconds=AGGREGATION_INTERVAL)
            label, items = _select(strategy, config, day)
            reads, selections = reads + items, selections + 1
            if label != "premium":
                break
            if spent >= QUOTA_USD_MICROS:
                past_quota += 1
            spent += _meter(config, "premium", now, **CALL)
            now += step
        return Result(max(0, spent - QUOTA_USD_MICROS), past_quota,
                      (now - START).total_seconds() - phase, reads * 0.5 / selections)


def _run_case(case: tuple[str, str, int]) -> tuple[tuple[str, str, int], Result]:
    return case, run(case[1], case[0], case[2])


def main() -> None:
    scenarios = ("cold", "warm", "cold, tight at 50 %")
    cases = [(scenario, strategy, phase) for scenario in scenarios for strategy in ("before", "after", "live")
             for phase in PHASES]
    print(f"burst {RATE_PER_SECOND} req/s of {CALL} on premium (quota {QUOTA_USD_MICROS:,} micro-USD), "
          f"{SHARDS} shards, aggregator every {AGGREGATION_INTERVAL} s; burst starts PHASE s after an aggregator run")
    print(f"{'scenario':<20} {'strategy':<7} {'phase':>5} {'overshoot µ$':>13} {'% quota':>8} "
          f"{'req past':>8} {'moved at s':>10} {'RCU/sel':>7}")
    # one moto per case, each in its own process (the cases are independent)
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for (scenario, strategy, phase), result in pool.map(_run_case, cases):
            print(f"{scenario:<20} {strategy:<7} {phase:>5} {result.overshoot_usd_micros:>13,} "
                  f"{100 * result.overshoot_usd_micros / QUOTA_USD_MICROS:>7.0f}% "
                  f"{result.requests_past_quota:>8} {result.seconds_to_move:>10.2f} "
                  f"{result.read_units_per_selection:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
