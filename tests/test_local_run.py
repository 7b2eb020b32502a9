"""``make run`` as a newcomer sees it: ``python -m local`` in a process group of its own,
stopped the ways a terminal or a process manager stops it (Ctrl-C, a double SIGTERM to the
group), with the pricing fetcher running at start as it does there. It exits promptly with
status 0, and its output is the banner and one plain line per log event: no event twice,
none as JSON, nothing from moto."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import requests

from tests.local_server import launch

pytestmark = pytest.mark.e2e

KEY = "local-run-provisioning-key"
STOP_DEADLINE_SECONDS = 10
WAIT_SECONDS = 30
ORG_ID = "0b5f2a8e-8a38-4c36-9d2a-3e1f6a4c7d10"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S")
BANNER = ("Bedrock Price Keeper is running at ", "  ")
FETCHER_FAILED = "price list unavailable"  # moto has no Price List: the fetcher's one warning


def output_with(log, text: str) -> str:
    deadline = time.monotonic() + WAIT_SECONDS
    while text not in (output := log.read_text()):
        assert time.monotonic() < deadline, f"no {text!r} in the output:\n{output}"
        time.sleep(0.2)
    return output


@pytest.mark.parametrize(
    "signals", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT,)], ids=["double-SIGTERM", "Ctrl-C"]
)
def test_stops_promptly_and_prints_each_event_once(tmp_path, signals):
    server = launch(tmp_path, KEY, own_process_group=True, PRICING_REFRESH_INTERVAL_SECONDS="86400")
    try:
        refused = requests.put(
            f"{server.base_url}/api/v1/orgs/{ORG_ID}", headers={"X-API-Key": "wrong"}, json={}, timeout=10
        )
        assert refused.status_code == 401  # and its audit line is an event of the put_org function
        output_with(server.log, FETCHER_FAILED)
        output_with(server.log, '"org.put"')
        stopping = time.monotonic()
        for sent in signals:
            os.killpg(server.process.pid, sent)
        status = server.process.wait(timeout=STOP_DEADLINE_SECONDS)
        assert time.monotonic() - stopping < STOP_DEADLINE_SECONDS
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_DEADLINE_SECONDS} s after {signals}:\n{server.log.read_text()}")
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    output = server.log.read_text()
    lines = output.splitlines()
    assert status == 0, output
    assert lines[-2:] == [f"{signal.Signals(signals[0]).name}: stopping", "stopped"], output
    events = [line for line in lines[:-2] if not line.startswith(BANNER)]
    assert events and all(LOG_LINE.match(line) for line in events), output
    assert len(set(lines)) == len(lines), output
    assert sum(FETCHER_FAILED in line for line in lines) == 1, output
    assert sum('"org.put"' in line for line in lines) == 1, output
    assert "Unable to find appropriate backend" not in output
