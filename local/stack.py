"""The local stack's AWS side: an embedded moto server (loopback only) with the seven
tables (the usage table with its stream) and the two secrets, persisted across restarts,
and the Bedrock inference-profile stand-in moto lacks (``local/bedrock.py``; served by the
local HTTP server).

Persistence uses moto's request recorder: every request moto serves that changes state is
appended to ``.local/moto-journal.jsonl`` (not the reads: the usage stream alone is polled
several times a second); at start-up the journal is compacted to its writes (journals of
older versions hold reads too) and replayed, which rebuilds tables, items and secrets.
Application inference profiles are kept in ``.local/inference-profiles.json``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path
from types import SimpleNamespace

import boto3

from price_keeper.aws.events import event_bus
from price_keeper.store.tables import ALL_TABLES, TTL_ATTRIBUTE

from . import moto_patches
from .bedrock import InferenceProfiles
from .gateway import ROOT

STATE_DIR = Path(os.environ.get("LOCAL_STATE_DIR") or ROOT / ".local")  # tests point it at a temp dir
JOURNAL = STATE_DIR / "moto-journal.jsonl"
INFERENCE_PROFILES = STATE_DIR / "inference-profiles.json"
JWT_SECRET_NAME = "price-keeper/jwt-signing-key"
PROVISIONING_SECRET_NAME = "price-keeper/provisioning-api-key"

# Requests that change state; everything else is dropped when the journal is compacted.
_WRITE_TARGETS = (
    "DynamoDB_20120810.CreateTable",
    "DynamoDB_20120810.UpdateTimeToLive",
    "DynamoDB_20120810.PutItem",
    "DynamoDB_20120810.UpdateItem",
    "DynamoDB_20120810.DeleteItem",
    "DynamoDB_20120810.BatchWriteItem",
    "DynamoDB_20120810.TransactWriteItems",
    "secretsmanager.CreateSecret",
    "secretsmanager.PutSecretValue",
    "secretsmanager.UpdateSecret",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _target(headers) -> str:
    return {k.lower(): v for k, v in headers.items()}.get("x-amz-target", "")


def _is_write(headers) -> bool:
    return _target(headers) in _WRITE_TARGETS


def _is_dynamodb(headers) -> bool:
    return _target(headers).startswith("DynamoDB_")


def _journal_writes_only(recorder) -> None:
    """Make moto's recorder keep only the requests that change state, DynamoDB's in the
    order moto serves them: recorded while they hold its request lock, so a replay writes
    the items, and the usage stream's records (``moto_patches``, 4.), in the same order."""
    from moto.dynamodb.responses import DynamoHandler

    record = recorder._record_request

    def writes_only(request, body=None):
        if _is_write(request.headers) and not _is_dynamodb(request.headers):
            record(request, body)

    recorder._record_request = writes_only
    serve = DynamoHandler.call_action

    def served_in_order(handler):
        with moto_patches.REQUEST_LOCK:
            if _is_write(handler.headers):
                request = SimpleNamespace(
                    headers=handler.headers, method=handler.method, raw_url=handler.uri, raw_path=handler.raw_path
                )
                record(request, handler.body)
            return serve(handler)

    DynamoHandler.call_action = served_in_order


def _private_state() -> None:
    """``.local/`` 0700 and the journal 0600 before anything is written to them: the journal
    holds the JWT signing key and the provisioning key. Tightened at every start, so a folder
    an older version left readable is private too."""
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    os.close(os.open(JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(JOURNAL, 0o600)


def _compact_journal() -> None:
    kept = []
    for line in JOURNAL.read_text().splitlines():
        if _is_write(json.loads(line).get("headers", {})):
            kept.append(line)
    JOURNAL.write_text("".join(f"{line}\n" for line in kept))


class LocalAws:
    """Starts moto, restores the journal, and makes sure tables and secrets exist; holds
    the Bedrock stand-in."""

    def __init__(self, persist: bool = True, dynamodb_endpoint: str | None = None):
        self.persist = persist
        self.dynamodb_endpoint = dynamodb_endpoint
        self.bedrock = InferenceProfiles(INFERENCE_PROFILES if persist else None)
        self.server = None
        self.url = ""

    def start(self) -> LocalAws:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        if self.persist:
            _private_state()
            os.environ["MOTO_ENABLE_RECORDING"] = "True"
            os.environ["MOTO_RECORDER_FILEPATH"] = str(JOURNAL)
        from moto.moto_api import recorder
        from moto.server import ThreadedMotoServer

        moto_patches.apply()

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"
        os.environ["AWS_ENDPOINT_URL"] = self.url
        if self.dynamodb_endpoint:
            os.environ["DYNAMODB_ENDPOINT_URL"] = self.dynamodb_endpoint
        else:
            os.environ["DYNAMODB_ENDPOINT_URL"] = self.url
        if self.persist:
            if JOURNAL.exists():
                _compact_journal()
                recorder.replay_recording(target_host=self.url)
            _journal_writes_only(recorder)
            recorder.start_recording()
        self._ensure_tables()
        self._ensure_event_bus()
        return self

    def _ensure_tables(self) -> None:
        ddb = boto3.client("dynamodb", endpoint_url=os.environ["DYNAMODB_ENDPOINT_URL"])
        existing = set(ddb.list_tables()["TableNames"])
        for spec in ALL_TABLES:
            if spec.physical_name in existing:
                continue
            ddb.create_table(**spec.create_table_kwargs())
            if spec.ttl_attribute:
                ddb.update_time_to_live(
                    TableName=spec.physical_name,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
                )

    def _ensure_event_bus(self) -> None:
        """The bus spend alerts are published on (created at every start: not journaled)."""
        events = boto3.client("events")
        if not any(bus["Name"] == event_bus() for bus in events.list_event_buses()["EventBuses"]):
            events.create_event_bus(Name=event_bus())

    def ensure_secret(self, name: str, value: str | None = None) -> str:
        """The secret's value, creating it (with ``value`` or a random one) if missing."""
        sm = boto3.client("secretsmanager")
        try:
            current = sm.get_secret_value(SecretId=name)["SecretString"]
        except sm.exceptions.ResourceNotFoundException:
            current = None
        if current is None:
            current = value or secrets.token_urlsafe(32)
            sm.create_secret(Name=name, SecretString=current)
        elif value and value != current:
            sm.put_secret_value(SecretId=name, SecretString=value)
            current = value
        return current

    def stop(self) -> None:
        if self.server:
            self.server.stop()
            self.server = None
