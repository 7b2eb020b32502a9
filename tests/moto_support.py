"""Two limits of moto 5.2.5's in-process DynamoDB that volume and concurrency tests hit, and
how these tests work around them without changing what moto answers:

1. moto is not thread-safe: ``TransactWriteItems`` deep-copies whole tables for rollback
   while other threads mutate them ("dictionary changed size during iteration"), and a
   rollback can restore a snapshot over another thread's committed write. DynamoDB
   serialises the operations on an item; ``serialized_moto`` makes moto serialise every
   request the same way (one at a time), so the threads of a test still race each other
   for the same items exactly as they would against DynamoDB.
2. That whole-table deep copy makes each transaction cost O(table size), so thousands of
   transactions into one table take minutes. ``serialized_moto`` replaces the copy with a
   snapshot of just the items the transaction touches, restored on cancellation, which
   is all the rollback needs.
"""

from __future__ import annotations

import copy
import threading
import types
from contextlib import contextmanager

from moto.core.botocore_stubber import BotocoreStubber
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.exceptions import (
    MockValidationException,
    MultipleTransactionsException,
    TransactionCanceledException,
)
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table

_lock = threading.RLock()


def _touched_key(backend: DynamoDBBackend, operation: dict) -> tuple[str, dict] | None:
    table = backend.tables.get(operation.get("TableName"))
    if table is None:
        return None
    if "Key" in operation:
        return table.name, operation["Key"]
    item = operation["Item"]
    key_names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
    return table.name, {name: item[name] for name in key_names}


def _item_snapshot_transaction(original):
    def transact_write_items(self: DynamoDBBackend, transact_items):
        snapshots = []
        for entry in transact_items:
            touched = _touched_key(self, next(iter(entry.values())))
            if touched:
                current = self.get_item(*touched)
                snapshots.append((touched, copy.deepcopy(current.to_json()["Attributes"]) if current else None))
        try:
            return original(self, transact_items)
        except (TransactionCanceledException, MultipleTransactionsException, MockValidationException):
            for (table_name, key), before in reversed(snapshots):
                if before is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, before)
            raise

    return transact_write_items


def _serialized(process_request):
    def locked(self, request):
        with _lock:
            return process_request(self, request)

    return locked


@contextmanager
def serialized_moto():
    """Serialise moto's request handling and make transaction rollback per item (see above)."""
    saved_process = BotocoreStubber.process_request
    saved_transact = DynamoDBBackend.transact_write_items
    saved_copy = dynamodb_models.copy
    BotocoreStubber.process_request = _serialized(saved_process)
    DynamoDBBackend.transact_write_items = _item_snapshot_transaction(saved_transact)
    # moto's own whole-table snapshot becomes the table itself (restoring it is a no-op);
    # the item snapshots above do the rollback.
    dynamodb_models.copy = types.SimpleNamespace(
        deepcopy=lambda value, *args: value if isinstance(value, Table) else copy.deepcopy(value, *args)
    )
    try:
        yield
    finally:
        BotocoreStubber.process_request = saved_process
        DynamoDBBackend.transact_write_items = saved_transact
        dynamodb_models.copy = saved_copy
