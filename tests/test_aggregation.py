"""The aggregator on moto: folds exactly the active shards of the days in play into
DailyTotal, idempotently, never backwards, without scans, and reports its lag."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from price_keeper import aggregation, keys, tables
from price_keeper.store.dynamo import ddb_client, table
from price_keeper.timeutil import org_day
from tests.factories import seed_org
from local.gateway import LambdaContext, load_handler
from tests.usage_support import daily_total, new_tenant, usage_body

NOW = datetime(2026, 1, 23, 15, 30, tzinfo=timezone.utc)
DAY = "20260123"


def put_shard(scope: str, label: str, shard: int, day: str = DAY, cost: int = 100, requests: int = 1,
              updated_at: int | None = None) -> None:
    """A usage shard in the shape the metering writes it."""
    table(tables.USAGE_AGG_SHARDED).put_item(Item={
        "shard_key": keys.shard_key(scope, label, shard), "date_key": f"DAY#{day}", "active_day": f"DAY#{day}",
        "cost_usd_micros": cost, "input_tokens": 10 * requests, "output_tokens": 5 * requests,
        "cache_read_input_tokens": 0, "cache_write_input_tokens": 0, "requests": requests,
        "updated_at_epoch": updated_at or int(NOW.timestamp()) - 5, "expires_at_epoch": 2_000_000_000,
    })


def total(scope: str, label: str, day: str = DAY) -> dict | None:
    return daily_total(scope, label, day)


@pytest.fixture
def calls(aws):
    """DynamoDB operations made through the service's client, with the keys they asked for."""
    seen = Counter()
    keys_read = []

    def count(params, model, **_):
        seen[model.name] += 1
        for request in params.get("RequestItems", {}).values():
            keys_read.extend(request.get("Keys", []))

    ddb_client().meta.events.register("before-parameter-build.dynamodb", count)
    return seen, keys_read


def test_shards_fold_into_daily_totals(aws):
    put_shard("ORG#a", "premium", 0, cost=100, requests=1)
    put_shard("ORG#a", "premium", 5, cost=250, requests=3)
    put_shard("ORG#a", "standard", 1, cost=7)
    put_shard("ORG#b#APP#x", "premium", 2, cost=40, requests=2)
    report = aggregation.run(NOW)
    assert (report.active_shards, report.usage_keys, report.totals_written) == (4, 3, 5)  # 3 labels, 2 scopes
    scope_total = table(tables.DAILY_TOTAL).get_item(Key={"usage_key": "ORG#a#TOTAL", "date_key": f"DAY#{DAY}"})["Item"]
    assert (scope_total["cost_usd_micros"], scope_total["requests"], scope_total["labels"]) == (
        357, 5, {"premium", "standard"})
    premium = total("ORG#a", "premium")
    assert (premium["cost_usd_micros"], premium["requests"], premium["input_tokens"], premium["output_tokens"]) == (
        350, 4, 40, 20)
    assert total("ORG#a", "standard")["cost_usd_micros"] == 7
    assert total("ORG#b#APP#x", "premium")["requests"] == 2
    assert premium["updated_at_epoch"] == int(NOW.timestamp())
    assert premium["expires_at_epoch"] == aggregation.usage_expires_at(DAY)


def test_a_second_run_writes_nothing_and_a_change_rewrites_one_total(aws):
    put_shard("ORG#a", "premium", 0)
    put_shard("ORG#a", "standard", 0)
    aggregation.run(NOW)
    again = aggregation.run(NOW + timedelta(minutes=1))
    assert again.totals_written == 0 and again.lag_seconds == 0
    put_shard("ORG#a", "premium", 3, cost=900, updated_at=int(NOW.timestamp()) + 90)
    third = aggregation.run(NOW + timedelta(minutes=2))
    assert third.totals_written == 2  # premium and the scope's total
    assert total("ORG#a", "premium")["cost_usd_micros"] == 1000


def test_a_total_never_moves_backwards(aws):
    put_shard("ORG#a", "premium", 0, cost=100, requests=1)
    table(tables.DAILY_TOTAL).put_item(Item={"usage_key": "ORG#a#LABEL#premium", "date_key": f"DAY#{DAY}",
                                             "cost_usd_micros": 500, "requests": 5})  # a newer run's total
    report = aggregation.run(NOW)
    assert (report.totals_written, report.stale_puts_skipped) == (1, 1)  # the scope total is new
    assert total("ORG#a", "premium")["cost_usd_micros"] == 500


def test_only_the_org_days_in_play_are_folded(aws):
    put_shard("ORG#a", "premium", 0, day="20260121")  # UTC today - 2: a previous org day, still open
    put_shard("ORG#a", "premium", 0, day="20260124")  # UTC tomorrow: Auckland's today
    put_shard("ORG#a", "premium", 0, day="20260120")  # closed everywhere
    report = aggregation.run(NOW)
    assert report.days == ["20260121", "20260122", "20260123", "20260124"]
    assert total("ORG#a", "premium", "20260121") and total("ORG#a", "premium", "20260124")
    assert total("ORG#a", "premium", "20260120") is None


def test_work_grows_with_active_scopes_not_with_all_orgs(calls):
    seen, keys_read = calls
    for _ in range(30):
        seed_org()  # registered, idle
    put_shard("ORG#a", "premium", 0)
    put_shard("ORG#a", "premium", 1)
    put_shard("ORG#b", "economy", 7)
    seen.clear()
    aggregation.run(NOW)
    assert "Scan" not in seen
    assert seen["Query"] == 4  # one per day in play
    assert seen["BatchGetItem"] == 2  # the shards, then the totals
    assert seen["PutItem"] == 2 + 2 + 1  # the two label totals, the two scope totals and the heartbeat
    assert len(keys_read) == 3 + 2 + 2


def test_lag_is_the_age_of_the_oldest_unfolded_update(aws):
    put_shard("ORG#a", "premium", 0, updated_at=int(NOW.timestamp()) - 42)
    put_shard("ORG#a", "premium", 1, updated_at=int(NOW.timestamp()) - 10)
    assert aggregation.run(NOW).lag_seconds == 42
    put_shard("ORG#a", "premium", 1, cost=500, updated_at=int(NOW.timestamp()) + 30)
    assert aggregation.run(NOW + timedelta(seconds=50)).lag_seconds == 20
    heartbeat = table(tables.DAILY_TOTAL).get_item(Key=keys.HEARTBEAT_KEY)["Item"]
    assert heartbeat["last_run_epoch"] == int(NOW.timestamp()) + 50 and heartbeat["lag_seconds"] == 20


def test_a_run_that_fails_half_way_is_completed_by_the_next(aws, monkeypatch):
    for label in ("premium", "standard", "economy"):
        put_shard("ORG#a", label, 0, cost=11)
    real_put = aggregation._put_total
    written = []

    def fail_after_one(*args):
        if written:
            raise RuntimeError("Lambda timed out")
        written.append(real_put(*args))
        return written[-1]

    monkeypatch.setattr(aggregation, "_put_total", fail_after_one)
    with pytest.raises(RuntimeError):
        aggregation.run(NOW)
    monkeypatch.setattr(aggregation, "_put_total", real_put)
    assert aggregation.run(NOW).totals_written == 2 + 1  # the two labels left and the scope total
    assert all(total("ORG#a", label)["cost_usd_micros"] == 11 for label in ("premium", "standard", "economy"))


def test_the_scheduled_handler_reports_the_run(api):
    tenant = new_tenant()
    api.post(tenant.app_path + "/usage", usage_body(), token=tenant.token)
    report = load_handler("aggregator")({"source": "aws.events"}, LambdaContext("aggregator"))
    assert report["totals_written"] == 2 and report["active_shards"] == 1  # the label and the scope total
    assert total(tenant.scope, "premium", org_day("America/New_York"))["cost_usd_micros"] == 3760
