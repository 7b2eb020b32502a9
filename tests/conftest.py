"""Shared fixtures: a moto-backed AWS per test and an in-process API Gateway."""

from __future__ import annotations

import copy
import functools
import gc
import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

# TEST_UTC_TIME=HH:MM: the whole run, and the processes it starts, on a clock shifted to that time today.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "clock"))
import pk_test_clock  # noqa: E402

pk_test_clock.shift_from_environment()
pk_test_clock.travel()

# Handlers must import with no environment; tests then set only what a deployment sets.
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from local import gateway, moto_patches  # noqa: E402
from local.bedrock import InferenceProfiles  # noqa: E402
from local.server import LocalHttpServer  # noqa: E402
from local.stack import JWT_SECRET_NAME, PROVISIONING_SECRET_NAME  # noqa: E402
from price_keeper import (  # noqa: E402
    ratelimit,
    routes,
    state,  # noqa: E402
)
from price_keeper.aws import bedrock  # noqa: E402
from price_keeper.store.tables import ALL_TABLES, TTL_ATTRIBUTE  # noqa: E402
from tests.iam_check import only_granted  # noqa: E402

PROVISIONING_KEY = "test-provisioning-key"
moto_patches.apply()  # moto serialised, with per-item rollback, as the local stack runs it


# --- test kinds (markers): `make check` runs the fast ones, `make test` all ---------------


def _starts_a_server(item) -> bool:
    """The test or one of its fixtures comes from a module that launches ``python -m local``."""
    modules = [
        item.module,
        *(
            sys.modules.get(definition.func.__module__)
            for definitions in item._fixtureinfo.name2fixturedefs.values()
            for definition in definitions
        ),
    ]
    starters = ("local_server", "reconciling_server")
    return any(getattr(module, starter, None) is not None for module in modules for starter in starters)


def pytest_collection_modifyitems(config, items):
    """Give every test its kind, so new tests need no marker of their own: ``infra`` (synth)
    under tests/infra, ``e2e`` when it talks HTTP to a local server, ``handler`` when it
    runs on moto (the ``aws`` fixture), ``unit`` otherwise. ``slow`` is set by hand."""
    for item in items:
        if "infra" in item.path.parts:
            item.add_marker(pytest.mark.infra)
        elif item.get_closest_marker("e2e") or _starts_a_server(item):
            item.add_marker(pytest.mark.e2e)
        elif "aws" in item.fixturenames:
            item.add_marker(pytest.mark.handler)
        else:
            item.add_marker(pytest.mark.unit)


def pytest_configure(config):
    """The cyclic garbage collector less often (Python's default: every 700 allocations, a
    full collection every 70,000): the modules and test items, moto's backends and botocore's
    models live as long as the process, and walking them again and again cost about a fifth
    of the CPU of ``make check``. Garbage is still collected, and ``gc.get_objects()`` still
    sees everything (``gc.freeze()`` would hide what it froze)."""
    gc.set_threshold(10_000, 10, 10)


@functools.cache
def _shared_session():
    """One boto3 session for every test: clients built on it reuse its loaded service models
    and endpoint rules (about 0.1 s per client otherwise). Made after moto's import, it
    carries moto's request hook; credentials come from the environment each test sets."""
    import boto3

    return boto3.Session()


@functools.cache
def _setup_client(service: str):
    """The fixture's own client of ``service``, made once per process (about 4 ms a client):
    moto's hook is on every client and intercepts whenever a mock is on."""
    return _shared_session().client(service)


_created_tables: dict = {}


def _create_tables() -> None:
    """The seven tables, with their TTL, in the moto account just started. The first test
    of a process creates them through the API; every later one gets deep copies of those
    (fresh, empty tables: 0.4 ms instead of about 35 ms of create and TTL calls)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    tables = dynamodb_backends[DEFAULT_ACCOUNT_ID][os.environ["AWS_DEFAULT_REGION"]].tables
    if _created_tables:
        tables.update(copy.deepcopy(_created_tables))
        return
    ddb = _setup_client("dynamodb")
    for spec in ALL_TABLES:
        ddb.create_table(**spec.create_table_kwargs())
        ddb.update_time_to_live(
            TableName=spec.physical_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
        )
    _created_tables.update(copy.deepcopy(tables))


@pytest.fixture
def aws(monkeypatch):
    """A fresh moto DynamoDB + Secrets Manager with the seven tables and both secrets."""
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "DYNAMODB_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("BCRYPT_ROUNDS", "4")  # the cost factor is configuration; 12 in production
    monkeypatch.setenv("RATE_LIMITS", "off")  # tests of the limits turn them on (the limits_on fixture)
    monkeypatch.setenv("JWT_SECRET_NAME", JWT_SECRET_NAME)
    monkeypatch.setenv("PROVISIONING_SECRET_NAME", PROVISIONING_SECRET_NAME)
    with mock_aws():
        import boto3

        boto3.DEFAULT_SESSION = _shared_session()  # moto clears it; a new one reloads every service model
        state.reset()

        _create_tables()
        sm = _setup_client("secretsmanager")
        sm.create_secret(Name=JWT_SECRET_NAME, SecretString="test-signing-key-" + uuid.uuid4().hex)
        sm.create_secret(Name=PROVISIONING_SECRET_NAME, SecretString=PROVISIONING_KEY)
        yield
        state.reset()


@pytest.fixture
def limits_on(aws, monkeypatch):
    """Per-client rate limits switched on (the ``aws`` fixture turns them off), with no
    allowance leased by an earlier test, and their clock held mid-window so that a minute
    boundary never falls between a test's requests."""
    monkeypatch.setenv("RATE_LIMITS", "on")
    held = (time.time() // 3600) * 3600 + 30
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: held))
    ratelimit._local.clear()
    yield
    ratelimit._local.clear()


class Reply:
    def __init__(self, response: dict):
        self.status = response["statusCode"]
        self.headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
        for name, values in (response.get("multiValueHeaders") or {}).items():
            self.headers.setdefault(name.lower(), values[-1])
        self.text = response.get("body") or ""

    def json(self):
        return json.loads(self.text)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.text[:300]}>"


class Api:
    """Calls the real Lambda handlers with real API Gateway proxy events, failing on any
    DynamoDB call the function's deployed role would be denied (tests/iam_check.py), through
    the gateway ``kind`` (``local.gateway.KINDS``: HTTP API or REST API events)."""

    def __init__(self, kind: str = gateway.DEFAULT_KIND):
        self.kind = kind

    def request(
        self,
        method: str,
        path: str,
        body=None,
        headers: dict | None = None,
        query: str = "",
        token: str | None = None,
        api_key: str | None = None,
        source_ip: str = "127.0.0.1",
    ) -> Reply:
        headers = dict(headers or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if api_key:
            headers["X-API-Key"] = api_key
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
            headers.setdefault("Content-Type", "application/json")
        found = routes.match(method, path)
        with only_granted(found[0].function if found else None):  # the deployed role would allow it
            return Reply(
                gateway.invoke(
                    method, path, body=body, headers=headers, query=query, source_ip=source_ip, kind=self.kind
                )
            )

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body=body, **kw)


@pytest.fixture
def api(aws) -> Api:
    return Api()


def cold_handler(function: str):
    """``lambdas/<function>/handler.py``'s ``lambda_handler`` as a new Lambda container would
    import it: a module of its own, its router and app built under the environment of now.
    Building an app on the shared module's router instead would take that router's request
    state (event, principal) from the app the gateway calls."""
    spec = importlib.util.spec_from_file_location(f"cold_{function}_handler", gateway.LAMBDAS / function / "handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


@pytest.fixture
def fold_stream(aws):
    """Delivers what the usage stream gained since the last call to the aggregator, within its
    role, as the event source mapping does: the fold of ledger days (orgs made now), which the
    sweep (``aggregation.run``) never folds. Its reply (the run's summary), or None."""
    from local.streams import StreamReader
    from price_keeper.store import tables

    reader = StreamReader(tables.USAGE_AGG_SHARDED)

    def fold() -> dict | None:
        event = reader.event()
        if not event["Records"]:
            return None
        with only_granted("aggregator"):
            return gateway.load_handler("aggregator")(event, gateway.LambdaContext("aggregator"))

    return fold


@pytest.fixture
def dynamodb_calls(aws) -> list[tuple[str, dict]]:
    """(operation, parameters) of every DynamoDB call the service's client makes."""
    from price_keeper.store.dynamo import ddb_client

    seen = []
    ddb_client().meta.events.register(
        "provide-client-params.dynamodb.*", lambda params, model, **_: seen.append((model.name, params))
    )
    return seen


def keys_asked(operation: str, params: dict, table_spec) -> list[dict]:
    """The keys of ``table_spec`` a GetItem or BatchGetItem (of ``dynamodb_calls``) asks for."""
    name = table_spec.physical_name
    if operation == "BatchGetItem":
        return params["RequestItems"].get(name, {}).get("Keys", [])
    return [params["Key"]] if operation == "GetItem" and params["TableName"] == name else []


def profile_reads(calls: list[tuple[str, dict]]) -> list[str]:
    """The operation of each of ``calls`` (``dynamodb_calls``) that read registered
    profiles (Config ``PROFILE#`` items)."""
    from price_keeper.store import keys, tables

    return [
        operation
        for operation, params in calls
        if any(
            key["resource_key"].startswith(keys.profile_resource(""))
            for key in keys_asked(operation, params, tables.CONFIG)
        )
    ]


def assert_error(reply: Reply, status: int, code: str) -> dict:
    """The reply is ``status`` with the api_spec error schema and ``code``."""
    assert reply.status == status, reply
    body = reply.json()
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    assert body["timestamp"].endswith("Z")
    return body


@pytest.fixture
def emitted_metrics():
    """The custom metrics the code under test adds, as the EMF line its handler's
    ``log_metrics`` would print: ``emitted_metrics()`` is {metric name: values}. Every
    metric must carry the one dimension ``service`` (see price_keeper/metric_names.py)."""
    from price_keeper.observability import metrics

    def emitted() -> dict[str, list[float]]:
        if not metrics.metric_set:
            return {}
        line = metrics.serialize_metric_set()
        (directive,) = line["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["service"]], directive
        return {metric["Name"]: line[metric["Name"]] for metric in directive["Metrics"]}

    metrics.clear_metrics()  # with metrics disabled, log_metrics never clears what earlier tests added
    yield emitted
    metrics.clear_metrics()


@pytest.fixture
def bedrock_endpoint(monkeypatch) -> str:
    """URL of the local stack's Bedrock stand-in (moto has no inference profiles), fresh
    and in memory; the functions reach it through ``AWS_ENDPOINT_URL_BEDROCK``."""
    httpd = LocalHttpServer(0, InferenceProfiles())
    # shutdown() waits for the loop's next poll: 0.5 s by default, at every test's end
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK", url)
    clients = bedrock.bedrock_client  # a test may replace it (botocore Stubber)
    clients.cache_clear()
    yield url
    clients.cache_clear()
    httpd.shutdown()
    httpd.server_close()


TRANSACTION_HOLD_SECONDS = 0.01


@pytest.fixture
def clock(aws, monkeypatch):
    """Conflicts modelled on this process's moto (undone afterwards), on a clock of the
    test's: a transaction's answer waits for ``clock.answer`` (set: at once), then moves the
    clock past the transaction's hold, as the time it was in flight."""
    from moto.dynamodb.responses import DynamoHandler

    for name in ("call_action", "transact_write_items", "put_item", "update_item", "delete_item"):
        monkeypatch.setattr(DynamoHandler, name, getattr(DynamoHandler, name))
    now = [1000.0]
    answer = threading.Event()
    answer.set()

    def in_flight(seconds: float) -> None:
        assert answer.wait(10)
        now[0] += seconds

    monkeypatch.setattr(moto_patches, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=in_flight))
    moto_patches.model_conflicts(DynamoHandler, TRANSACTION_HOLD_SECONDS)
    return SimpleNamespace(now=now, answer=answer)
