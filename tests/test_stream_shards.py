"""The ledger's fold on a harness that behaves as DynamoDB does: the usage stream served as
16 shards, a record's by its partition key (``local/moto_patches.py``, 5.), the aggregator
invoked with one batch at a time per shard and the shards at once (``local/streams.py``),
and transactions that touch an item another holds cancelled with ``TransactionConflict``
(3.). One hot label among quiet label-days reaches every shard, so every shard's fold
writes its label total and scope total at once. The count is exact; speed is for
``benchmarks/stream_shards.py`` to print."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.test_fleet import running_harness

pytestmark = pytest.mark.slow
SHARDS = 16
HOT_RECORDS, QUIET_LABEL_DAYS = 240, 60


@pytest.fixture(scope="module")
def endpoint():
    """The fleet harness with a moto server of 16 stream shards and conflicts modelled."""
    with running_harness(stream_shards=SHARDS) as harness:
        yield harness


def test_a_hot_label_among_quiet_ones_over_16_stream_shards_is_counted_exactly(endpoint):
    from local.streams import StreamReader, StreamTrigger
    from price_keeper.bodies import UsageRequest
    from price_keeper.domain import metering
    from price_keeper.store import daily_totals, keys, tables
    from price_keeper.timeutil import org_day
    from tests.usage_support import usage_body

    (hot_org, hot_app), *quiet = endpoint.seed_scopes(1 + QUIET_LABEL_DAYS)
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    assert len(reader.streams.describe_stream(StreamArn=reader.arn)["StreamDescription"]["Shards"]) == SHARDS
    stop = threading.Event()
    delivered_shards: set[str] = set()
    trigger = StreamTrigger("aggregator", reader, stop)
    deliver = trigger._deliver

    def noted(shard_id, batch):
        delivered_shards.add(shard_id)
        return deliver(shard_id, batch)

    trigger._deliver = noted
    trigger.start()

    def report(org_app: tuple[str, str]) -> int:
        body = usage_body(model_label="premium", input_tokens=1000, output_tokens=100)
        return metering.submit(*org_app, UsageRequest.model_validate(body))["processing"]["cost_usd_micros"]

    try:
        with ThreadPoolExecutor(8) as pool:
            hot = list(pool.map(report, [(hot_org, hot_app)] * HOT_RECORDS))
            quiet_costs = list(pool.map(report, quiet))
        day = org_day(endpoint.dynamodb_costs.TZ)
        wanted = {
            keys.usage_key(keys.scope_key(org, app, "APP"), "premium"): cost
            for (org, app), cost in zip([(hot_org, hot_app), *quiet], [sum(hot), *quiet_costs], strict=True)
        }

        def folded() -> dict[str, int]:
            found = daily_totals.read_days([(usage_key, day) for usage_key in wanted])
            return {usage_key: int(item["cost_usd_micros"]) for (usage_key, _), item in found.items()}

        deadline = time.monotonic() + 180
        while folded() != wanted:
            assert time.monotonic() < deadline, "the fold never reached the reports' totals"
            time.sleep(0.5)
        time.sleep(3)  # a record counted twice would show by now
        assert folded() == wanted
        hot_key = keys.usage_key(keys.scope_key(hot_org, hot_app, "APP"), "premium")
        requests = daily_totals.read_days([(hot_key, day)])[(hot_key, day)]["requests"]
        assert requests == HOT_RECORDS
        assert len(delivered_shards) > SHARDS // 2  # the hot label's records came through many shards
    finally:
        stop.set()
        trigger.join(30)
