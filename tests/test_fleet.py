"""The fleet harness (benchmarks/fleet.py) in small: container processes with their own
process state calling the real handlers, against one moto server. Exactness and the rate
limits' two promises are asserted; speed and cost are for the benchmark to print."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fleet  # noqa: E402

from price_keeper import state  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def endpoint():
    saved = dict(os.environ)
    started = fleet.Endpoint()
    try:
        yield started
    finally:
        started.stop()
        os.environ.clear()
        os.environ.update(saved)
        state.reset()


def test_a_fleet_counts_every_accepted_record_once(endpoint):
    """Single and batched clients of many tenants and labels, on containers cold then warm,
    with retried reports landing on other containers; the aggregator folds the stream."""
    containers = fleet.Fleet(4)
    try:
        args = SimpleNamespace(tenants=6, records=240, containers=4, batch=20, select_every=60, retries=0.2)
        costs, problems = fleet.metering_run(containers, args)
    finally:
        containers.stop()
    assert problems == []
    assert {row[0] for row in costs} == {"single", "batched"}


def test_24_containers_never_refuse_a_client_at_half_its_limit_nor_admit_more_than_it(endpoint):
    containers = fleet.Fleet(24)
    try:
        results = fleet.rate_limit_run(containers, 24, limit=240)
    finally:
        containers.stop()
    sent, refused, _, _ = results["50 %"]
    assert (sent, refused) == (120, 0)
    sent, refused, most, _ = results["150 %"]
    assert sent == 360 and refused > 0 and most <= 240
