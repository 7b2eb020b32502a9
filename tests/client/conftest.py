"""Fixtures for the client and CLI tests: the real local server over HTTP, provisioning
helpers, and a real bedrock-runtime client whose calls botocore's Stubber answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest
import requests
from botocore.stub import Stubber

from local.bedrock import event_message, stream_event
from price_keeper_client import Credentials, Provisioning
from tests.local_server import local_server
from tests.tenants import ORG, new_tenant

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING_KEY = "client-tests-provisioning-key"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Server:
    url: str
    api_key: str
    log: Path

    def provisioning(self) -> Provisioning:
        return Provisioning(self.url, self.api_key)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """``python -m local`` in a subprocess on a free port, in-memory, aggregating every second."""
    log_dir = tmp_path_factory.mktemp("server")
    with local_server(log_dir, PROVISIONING_KEY, AGGREGATOR_INTERVAL_SECONDS="1") as url:
        yield Server(url, PROVISIONING_KEY, next(log_dir.glob("server-*.log")))


ORG_DEFAULTS = {**ORG, "org_name": "client tests", "timezone": "Europe/Paris"}


def provision(server: Server, app_id: str = "app-1", **org_fields) -> tuple[str, Credentials]:
    """A new org with one app; returns the org id and the app's one-time credentials."""
    tenant = new_tenant(server.url, server.api_key, [app_id], **{**ORG_DEFAULTS, **org_fields})
    return tenant.org_id, Credentials(**tenant.credentials[app_id])


class CallLog:
    """Records (method, path, JSON body) of every answered HTTP exchange a ``requests.Session`` makes."""

    def __init__(self, session: requests.Session):
        self.calls: list[tuple[str, str, object]] = []
        session.hooks["response"].append(self._record)

    def _record(self, response, *args, **kwargs):
        body = response.request.body
        self.calls.append(
            (response.request.method, urlparse(response.request.url).path, json.loads(body) if body else None)
        )

    def bodies(self, method: str, path_suffix: str) -> list:
        return [body for m, p, body in self.calls if m == method and p.endswith(path_suffix)]

    def count(self, method: str, path_suffix: str) -> int:
        return len(self.bodies(method, path_suffix))


class FakeClock:
    def __init__(self, start: float = 1_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def converse_response(
    text: str = "Hello!", input_tokens: int = 1500, output_tokens: int = 800, cache_read: int = 0, cache_write: int = 0
) -> dict:
    """A Converse response shaped as bedrock-runtime returns it."""
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": input_tokens + output_tokens + cache_read + cache_write,
            "cacheReadInputTokens": cache_read,
            "cacheWriteInputTokens": cache_write,
        },
        "metrics": {"latencyMs": 412},
    }


def stubbed_bedrock(region: str = "us-east-1"):
    """A real bedrock-runtime client and its activated Stubber (queue responses on it)."""
    client = boto3.client(
        "bedrock-runtime", region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    stubber = Stubber(client)
    stubber.activate()
    return client, stubber


def wait_for(probe, timeout: float = 30.0, interval: float = 0.25):
    """Polls ``probe()`` until it returns something truthy (eventual consistency of the aggregator)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def wait_for_quota_exceeded(keeper):
    """The ``QuotaExceeded`` model selection raises once the aggregator has folded the spend
    (``None`` if it never does within ``wait_for``'s timeout)."""
    from price_keeper_client import QuotaExceeded

    def spent():
        try:
            keeper.select_model(force=True)
        except QuotaExceeded as error:
            return error
        return None

    return wait_for(spent)


def cli(server: Server, *args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Runs the installed ``price-keeper`` console script against the test server."""
    full_env = {name: value for name, value in os.environ.items() if not name.startswith("PRICE_KEEPER_")}
    full_env.update(PRICE_KEEPER_URL=server.url, **(env or {}))
    return subprocess.run(
        [str(BIN / "price-keeper"), *args], env=full_env, input=stdin, capture_output=True, text=True, timeout=60
    )


# --- ConverseStream on the wire ---------------------------------------------------------


def stream_exception(exception_type: str, message: str) -> bytes:
    """An error inside the stream, as Bedrock sends it (botocore raises ``EventStreamError``)."""
    return event_message(
        {":exception-type": exception_type, ":content-type": "application/json", ":message-type": "exception"},
        {"message": message},
    )


def stream_events(
    text: str = "Hello there", input_tokens: int = 1500, output_tokens: int = 800, cache_read: int = 0
) -> list[bytes]:
    """A whole ConverseStream answer: message start, text deltas, stops, then ``metadata``."""
    half = len(text) // 2
    usage = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens + cache_read,
    }
    if cache_read:
        usage["cacheReadInputTokens"] = cache_read
    return [
        stream_event("messageStart", {"role": "assistant"}),
        stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text[:half]}}),
        stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text[half:]}}),
        stream_event("contentBlockStop", {"contentBlockIndex": 0}),
        stream_event("messageStop", {"stopReason": "end_turn"}),
        stream_event("metadata", {"usage": usage, "metrics": {"latencyMs": 412}}),
    ]


class WireStream:
    """The raw HTTP body botocore reads a ConverseStream answer from: ``stream()`` yields
    the encoded messages (then raises ``breaks_with``, if given, as a dropped connection would)."""

    def __init__(self, messages: list[bytes], breaks_with: BaseException | None = None):
        self.messages, self.breaks_with, self.closed = messages, breaks_with, False

    def stream(self, **_):
        yield from self.messages
        if self.breaks_with is not None:
            raise self.breaks_with

    def close(self):
        self.closed = True


def answer_converse_stream(client, *bodies: WireStream) -> list[dict]:
    """Makes ``client`` (a real bedrock-runtime client) receive ``bodies`` as the HTTP
    answers of its next ConverseStream calls; botocore parses them as it parses Bedrock's.
    Returns the requests' parsed JSON bodies (with the model id of the URL)."""
    from urllib.parse import unquote

    from botocore.awsrequest import AWSResponse

    pending, sent = list(bodies), []

    def respond(request, **_):
        model = unquote(request.url.split("/model/", 1)[1].rsplit("/converse-stream", 1)[0])
        sent.append({"modelId": model, **json.loads(request.body)})
        return AWSResponse(request.url, 200, {"Content-Type": "application/vnd.amazon.eventstream"}, pending.pop(0))

    client.meta.events.register("before-send.bedrock-runtime.ConverseStream", respond)
    return sent
