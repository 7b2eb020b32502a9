"""Every DynamoDB call a function makes must be granted to it by ``stacks/access.py``.

moto does not check IAM, so a layer change that calls a new table or action passes every
test and fails only when deployed (AccessDenied). ``only_granted(function)`` records the
DynamoDB calls made while a handler runs and fails the test on any call the function's role
would be denied. ``tests.conftest.Api`` wraps every handler call in it, so each handler test
is also a test of the access map. The hook records the calling thread only, so while it is
on, the layer's thread pools (the store's concurrent Queries, the fold's parallel
transactions) run their work in that thread, one after the other.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from contextlib import contextmanager
from unittest import mock

from price_keeper.domain import metering
from price_keeper.store import dynamo
from price_keeper.store.dynamo import ddb_client
from stacks.access import TABLE_ACCESS

# TransactWriteItems / TransactGetItems are authorised per action on each item's table.
_TRANSACT_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}


def required(operation: str, params: dict) -> list[tuple[str, str | None, str]]:
    """(table, index or None, IAM action) the call needs."""
    if operation in ("BatchGetItem", "BatchWriteItem"):
        return [(table, None, f"dynamodb:{operation}") for table in params["RequestItems"]]
    if operation in ("TransactWriteItems", "TransactGetItems"):
        return [
            (body["TableName"], None, f"dynamodb:{_TRANSACT_ACTIONS[kind]}")
            for action in params["TransactItems"]
            for kind, body in action.items()
        ]
    return [(params["TableName"], params.get("IndexName"), f"dynamodb:{operation}")]


def granted(function: str) -> set[tuple[str, str | None, str]]:
    result = set()
    for target, actions in TABLE_ACCESS[function].items():
        spec, index = target if isinstance(target, tuple) else (target, None)
        result |= {(spec.physical_name, index.name if index else None, action) for action in actions}
    return result


class _InCallingThread:
    """A ``ThreadPoolExecutor`` whose work runs in the thread that hands it over."""

    def __init__(self, *_, **__):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def map(self, fn, *iterables):
        return list(map(fn, *iterables))

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - delivered by result(), as a pool does
            future.set_exception(error)
        return future


@contextmanager
def only_granted(function: str | None):
    if function is None:
        yield
        return
    thread, seen = threading.get_ident(), []

    def record(params, model, **_):
        if threading.get_ident() == thread:
            seen.extend(required(model.name, params))

    events = ddb_client().meta.events
    events.register("provide-client-params.dynamodb", record)
    try:
        with (
            mock.patch.object(dynamo, "ThreadPoolExecutor", _InCallingThread),
            mock.patch.object(metering, "ThreadPoolExecutor", _InCallingThread),
        ):
            yield
    finally:
        events.unregister("provide-client-params.dynamodb", record)
    denied = sorted(set(seen) - granted(function), key=str)
    assert not denied, f"{function} makes DynamoDB calls stacks/access.py does not grant: {denied}"
