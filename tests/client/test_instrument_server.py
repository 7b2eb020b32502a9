"""The instrumented client against the real local server: failing open while the service is
unreachable, the spool sending what waited once it returns, a process killed (SIGKILL) with
reports queued and restarted (every record counted once), and the hard cap through
``instrument``. Bedrock is the server's stand-in."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import pytest
import requests

from price_keeper_client import ConnectionFailed, PriceKeeper, instrument
from price_keeper_client.models import UsageRecord
from tests.client.conftest import ROOT, FakeClock, provision, wait_for

MICRO = "amazon.nova-micro-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "abcd" * 15}]}]  # 60 characters: 15 tokens


class Switch(requests.adapters.HTTPAdapter):
    """The network between the app and the service: ``down`` refuses every connection."""

    down = False

    def send(self, request, *args, **kwargs):
        if self.down:
            raise requests.ConnectionError("service unreachable")
        return super().send(request, *args, **kwargs)


def session_with(switch: Switch) -> requests.Session:
    session = requests.Session()
    session.mount("http://", switch)
    return session


def runtime(server):
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=server.url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def spent_today(server, org_id: str, credentials) -> tuple[int, int]:
    """(requests, input tokens) the app's aggregates count today, over every label."""
    keeper = PriceKeeper(server.url, credentials.client_id, credentials.client_secret)
    try:
        spend = keeper.daily_spend()
    finally:
        keeper.close()
    return spend.total_requests, sum(label.input_tokens for label in spend.labels)


def test_fail_open_keeps_the_last_choice_and_the_spool_sends_once_the_service_returns(server, tmp_path, caplog):
    org_id, credentials = provision(server, model_ordering=["economy"], quotas={"economy": 50_000_000})
    switch, clock = Switch(), FakeClock()
    keeper = PriceKeeper(
        server.url,
        credentials.client_id,
        credentials.client_secret,
        session=session_with(switch),
        monotonic=clock,
        on_unavailable="fail_open",
        fail_open_for=timedelta(minutes=15),
        spool_dir=tmp_path,
        redeliver_after=0.1,
        report_in_background=True,
    )
    client = runtime(server)
    instrument(client, keeper, mode="enforce")
    client.converse(modelId=MICRO, messages=MESSAGES)  # the label map and the choice, read while up
    assert keeper.flush(30)
    switch.down = True
    clock.advance(400)  # past the cached choice's 300 s
    with caplog.at_level(logging.WARNING, logger="price_keeper_client"):
        assert keeper.select_model().label == "economy"  # the last choice
        for _ in range(3):
            client.converse(modelId=MICRO, messages=MESSAGES)  # enforce, failing open: called, reported later
    warnings = [r for r in caplog.records if "failing open" in r.getMessage()]
    assert len(warnings) == 1  # at most one a minute
    assert keeper.reporter.pending == 3 and keeper.spool.unsent == 3
    clock.advance(15 * 60 + 1)
    with pytest.raises(ConnectionFailed):  # fail_open_for is over
        keeper.select_model()
    switch.down = False
    assert keeper.flush(30) and keeper.spool.unsent == 0
    assert keeper.close()
    assert not list(tmp_path.glob("*.spool"))
    assert wait_for(lambda: spent_today(server, org_id, credentials) == (4, 60)), spent_today(
        server, org_id, credentials
    )


def test_fail_closed_raises_when_the_service_cannot_be_reached(server):
    _, credentials = provision(server)
    switch = Switch()
    keeper = PriceKeeper(server.url, credentials.client_id, credentials.client_secret, session=session_with(switch))
    switch.down = True
    with pytest.raises(ConnectionFailed):
        keeper.select_model()
    client = runtime(server)
    instrument(client, keeper, mode="enforce")
    with pytest.raises(ConnectionFailed):
        client.converse(modelId=MICRO, messages=MESSAGES)


CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    from datetime import UTC, datetime
    from price_keeper_client import PriceKeeper
    from price_keeper_client.models import UsageRecord

    url, client_id, secret, spool, phase = sys.argv[1:6]
    keeper = PriceKeeper(url, client_id, secret, report_in_background=True, spool_dir=spool)
    records = [UsageRecord(**{**r, "timestamp": datetime.now(UTC)}) for r in json.loads(sys.stdin.read())]
    if phase == "restart":
        print(json.dumps({"adopted": keeper.reporter.pending}), flush=True)
        print(json.dumps({"closed": keeper.close(60)}), flush=True)
        sys.exit(0)
    for record in records[:100]:  # counted, and marked done in the spool
        keeper.submit_usage(record)
    assert keeper.flush(60)
    sent, send = threading.Event(), keeper.reporter._send_batch

    def send_then_hang(batch):  # the service counts the batch; the process dies before its answer is used
        send(batch)
        sent.set()
        time.sleep(3600)

    keeper.reporter._send_batch = send_then_hang
    for record in records[100:]:
        keeper.submit_usage(record)
    sent.wait(60)
    print("queued", flush=True)
    time.sleep(3600)
    """
)


def test_a_process_killed_with_reports_queued_loses_none_and_counts_none_twice(server, tmp_path):
    org_id, credentials = provision(server, model_ordering=["economy"], quotas={"economy": 50_000_000})
    records = [
        {
            "request_id": str(uuid.uuid4()),
            "model_label": "economy",
            "bedrock_model_id": MICRO,
            "input_tokens": i + 1,
            "output_tokens": 1,
        }
        for i in range(300)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    args = [sys.executable, "-c", CHILD, server.url, credentials.client_id, credentials.client_secret, str(tmp_path)]
    child = subprocess.Popen([*args, "run"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    child.stdin.write(json.dumps(records))
    child.stdin.close()
    assert child.stdout.readline().strip() == "queued"  # 100 counted, 100 sent unanswered, 100 waiting
    child.kill()  # SIGKILL: no cleanup of any kind
    child.wait()
    (spool,) = tmp_path.glob("*.spool")
    assert spool.stat().st_size > 0
    restart = subprocess.run(
        [*args, "restart"], input="[]", capture_output=True, env=env, text=True, timeout=120, check=True
    )
    assert [json.loads(line) for line in restart.stdout.splitlines()] == [{"adopted": 200}, {"closed": True}]
    assert not list(tmp_path.glob("*.spool"))
    # a record reported after every other one: once it is counted, so are they
    sentinel = PriceKeeper(server.url, credentials.client_id, credentials.client_secret)
    sentinel.report_usage(UsageRecord(str(uuid.uuid4()), "economy", MICRO, 1_000_000, 1, datetime.now(UTC)))
    sentinel.close()
    expected = (301, sum(range(1, 301)) + 1_000_000)
    assert wait_for(lambda: spent_today(server, org_id, credentials) == expected, timeout=60), spent_today(
        server, org_id, credentials
    )


def test_hard_cap_reserves_and_the_report_settles(server):
    _, credentials = provision(server, model_ordering=["economy"], quotas={"economy": 50_000_000})
    keeper = PriceKeeper(server.url, credentials.client_id, credentials.client_secret)
    client = runtime(server)
    instrument(client, keeper, mode="hard_cap", background=False)
    reserved = []
    reserve = keeper.reserve
    keeper.reserve = lambda *args, **kwargs: reserved.append(reserve(*args, **kwargs)) or reserved[-1]
    answer = client.converse(modelId=MICRO, messages=MESSAGES, inferenceConfig={"maxTokens": 20})
    assert answer["usage"]["outputTokens"] == 20
    (reservation,) = reserved
    assert reservation.label == "economy"
    with pytest.raises(ValueError, match="maxTokens"):  # no bound of the output: nothing to reserve
        client.converse(modelId=MICRO, messages=MESSAGES)
    spend = wait_for(lambda: (s := keeper.daily_spend().labels[0]).requests == 1 and s.reserved_usd_micros == 0 and s)
    assert spend.input_tokens == 15 and spend.output_tokens == 20
    keeper.close()
