"""The fleet harness (benchmarks/fleet.py) in small: container processes with their own
process state calling the real handlers, against one moto server. Exactness and the rate
limits' two promises are asserted; speed and cost are for the benchmark to print."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from price_keeper import state

pytestmark = pytest.mark.slow
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@contextlib.contextmanager
def running_harness(**endpoint):
    """The harness module with its moto server (``fleet.Endpoint(**endpoint)``) running; the
    environment it sets (its endpoint, at import a benchmark's defaults) restored afterwards."""
    saved_environment, saved_path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    harness = importlib.import_module("fleet")
    harness.dynamodb_costs.bench_environment()  # (imported before: its import set it once)
    server = harness.Endpoint(**endpoint)
    try:
        yield harness
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved_environment)
        sys.path[:] = saved_path
        state.reset()


@pytest.fixture(scope="module")
def fleet():
    with running_harness() as harness:
        yield harness


def test_a_fleet_counts_every_accepted_record_once(fleet):
    """Single and batched clients of many tenants and labels, on containers cold then warm,
    with retried reports landing on other containers, single reports asking for the selection
    as the client library does; the aggregator folds the stream."""
    containers = fleet.Fleet(4)
    try:
        args = SimpleNamespace(
            tenants=6,
            records=240,
            containers=4,
            batch=20,
            select_every=60,
            single_select_every=4,
            single_select_by_get=False,
            retries=0.2,
        )
        costs, problems = fleet.metering_run(containers, args)
    finally:
        containers.stop()
    assert problems == []
    assert {row[0] for row in costs} == {
        "single",
        "batched",
        "single, selecting before every call",
        "single, past each client's first selection",
    }


def test_24_containers_never_refuse_a_client_at_half_its_limit_nor_admit_more_than_it(fleet):
    containers = fleet.Fleet(24)
    try:
        results = fleet.rate_limit_run(containers, 24, limit=240)
    finally:
        containers.stop()
    sent, refused, _, _ = results["50 %"]
    assert (sent, refused) == (120, 0)
    sent, refused, most, _ = results["150 %"]
    assert sent == 360 and refused > 0 and most <= 240


def test_24_containers_reserving_one_label_never_overshoot_its_quota(fleet):
    """The hard cap across container processes: every container reserves at once,
    each granted hold is settled at its worst case; spend stays within the quota and leaves
    less than one call's worst case unused."""
    containers = fleet.Fleet(24)
    try:
        asked, granted, quota, spend, overshoot, worst = fleet.reservation_run(containers, 24, per_container=6)
    finally:
        containers.stop()
    assert asked == 144 and 0 < granted < asked  # the quota binds
    assert overshoot == 0 and spend <= quota
    assert quota - spend < worst


def test_a_hot_label_reported_from_many_containers_counts_every_record_once(fleet):
    """The endpoint holds a transaction's items as DynamoDB does (``moto_patches``), so
    concurrent transactions conflict. A record is its marker, shared by no other: only a
    container's first record of the label-day (which lists the day's spend) is a
    transaction, and the fold counts every record once."""
    containers = fleet.Fleet(6)
    try:
        reports, accepted, *_, transactions, problems = fleet.hot_label_run(containers, 6, per_container=20)
    finally:
        containers.stop()
    assert (reports, accepted, problems) == (120, 120, [])
    # a container's first record of the label-day (5 attempts at most, conflicting on the entry)
    assert transactions * reports <= 6 * 5
