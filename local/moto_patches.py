"""moto's DynamoDB made to behave as DynamoDB does under concurrency and volume, for the
local stack, the tests and the benchmarks alike (``apply()``, once per process).

moto 5.2.5 answers every call correctly one at a time, but:

1. it is not thread-safe, and its threaded server serves requests at once: a transaction
   deep-copies every table it touches while another request changes it ("dictionary
   changed size during iteration": a 500), and a cancelled one swaps its copy back in,
   undoing whatever other requests wrote meanwhile (accepted usage lost). DynamoDB
   serialises the writes to an item; here every DynamoDB and DynamoDB Streams request
   takes one lock, so concurrent clients still race for the same items as they would;
2. that whole-table copy makes each transaction cost O(table size), stream included (a
   long local run or a fleet benchmark slows to a crawl), and a rollback leaves stream
   readers on the discarded copy's stream. A transaction here snapshots just the items it
   touches and restores them when it is cancelled, which is all a rollback needs; the
   table, and its stream, stay the same objects. What a cancelled transaction leaves in
   the stream (its writes and their undoing) only makes the aggregator fold a label
   again, which changes nothing.
"""

from __future__ import annotations

import copy
import threading
import types

_LOCK = threading.RLock()
_applied = False


def apply() -> None:
    """Patch moto in this process (idempotent)."""
    global _applied
    if _applied:
        return
    from moto.dynamodb import models as dynamodb_models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table
    from moto.dynamodb.responses import DynamoHandler
    from moto.dynamodbstreams.responses import DynamoDBStreamsHandler

    for handler in (DynamoHandler, DynamoDBStreamsHandler):
        handler.call_action = _serialized(handler.call_action)
    DynamoDBBackend.transact_write_items = _rolled_back_per_item(DynamoDBBackend.transact_write_items)
    # moto's own whole-table snapshot becomes the table itself (restoring it is a no-op).
    dynamodb_models.copy = types.SimpleNamespace(
        deepcopy=lambda value, *args: value if isinstance(value, Table) else copy.deepcopy(value, *args)
    )
    _applied = True


def _serialized(call_action):
    def serialized(self):
        with _LOCK:
            return call_action(self)

    return serialized


def _touched_key(backend, operation: dict) -> tuple[str, dict] | None:
    table = backend.tables.get(operation.get("TableName"))
    if table is None:
        return None
    if "Key" in operation:
        return table.name, operation["Key"]
    item = operation["Item"]
    key_names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
    if any(name not in item for name in key_names):
        return None  # moto refuses the Put itself
    return table.name, {name: item[name] for name in key_names}


def _rolled_back_per_item(transact_write_items):
    from moto.dynamodb.exceptions import (
        MockValidationException,
        MultipleTransactionsException,
        TransactionCanceledException,
    )

    def rolled_back(self, transact_items):
        snapshots = []
        for entry in transact_items:
            touched = _touched_key(self, next(iter(entry.values()), {}))
            if touched:
                current = self.get_item(*touched)
                snapshots.append((touched, copy.deepcopy(current.to_json()["Attributes"]) if current else None))
        try:
            return transact_write_items(self, transact_items)
        except (TransactionCanceledException, MultipleTransactionsException, MockValidationException):
            for (table_name, key), before in reversed(snapshots):
                if before is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, before)
            raise

    return rolled_back
