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
   table, and its stream, stay the same objects. A cancelled transaction leaves nothing
   in the stream either (its writes and their undoing are taken out of it, as DynamoDB
   never streams them): the ledger counts each insert of a marker;
3. it never cancels a transaction for a conflict: writes to one item are simply served in
   turn, so a hot label never spreads past its first shard and the code that handles
   ``TransactionConflict`` never runs under load. ``apply(transaction_hold_ms=...)`` models
   DynamoDB's rule instead (the fleet benchmark and its test use it): a transaction that
   succeeds is in flight for that long, holding every item it touched, and its caller gets
   the answer only then (outside the request lock, so others are served meanwhile); another
   transaction touching a held item is cancelled with ``TransactionConflict`` for it, and a
   single PutItem, UpdateItem or DeleteItem of one fails with
   ``TransactionConflictException``. A caller's own next request comes after its
   transaction is over, as on DynamoDB, so it never conflicts with it. Off (0) by default:
   the local stack and the other tests see moto's serial order;
4. a stream record's ``eventID`` is random. Here it is made from the table and the record's
   sequence number, so the local stack's journal, replayed after a restart into a new
   stream in the same order, gives each record the ``eventID`` it had: the ledger's
   checkpoints (``price_keeper.domain.ledger``), keyed by them, then find the chunks folded
   before the restart, and what was written but not folded is folded once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
import types

REQUEST_LOCK = threading.RLock()  # every DynamoDB and DynamoDB Streams request holds it (1. above)
_applied = False
_conflicts_modelled = False


def apply(transaction_hold_ms: float = 0) -> None:
    """Patch moto in this process (idempotent); ``transaction_hold_ms`` > 0 also models
    transaction conflicts (3. above), once."""
    global _applied, _conflicts_modelled
    from moto.dynamodb.responses import DynamoHandler

    if not _applied:
        from moto.dynamodb import models as dynamodb_models
        from moto.dynamodb.models import DynamoDBBackend
        from moto.dynamodb.models.table import StreamShard, Table
        from moto.dynamodbstreams.responses import DynamoDBStreamsHandler

        for handler in (DynamoHandler, DynamoDBStreamsHandler):
            handler.call_action = _serialized(handler.call_action)
        DynamoDBBackend.transact_write_items = _rolled_back_per_item(DynamoDBBackend.transact_write_items)
        StreamShard.add = _replayable_event_ids(StreamShard.add)
        # moto's own whole-table snapshot becomes the table itself (restoring it is a no-op).
        dynamodb_models.copy = types.SimpleNamespace(
            deepcopy=lambda value, *args: value if isinstance(value, Table) else copy.deepcopy(value, *args)
        )
        _applied = True
    if transaction_hold_ms > 0 and not _conflicts_modelled:
        model_conflicts(DynamoHandler, transaction_hold_ms / 1000)
        _conflicts_modelled = True


def _serialized(call_action):
    def serialized(self):
        with REQUEST_LOCK:
            return call_action(self)

    return serialized


def _replayable_event_ids(add):
    def add_and_name(self, old, new):
        before = len(self.items)
        add(self, old, new)
        if len(self.items) > before:  # (moto empties it when it feeds its own Lambda mappings)
            record = self.items[-1].record
            name = f"{self.table.name}/{record['dynamodb']['SequenceNumber']}"
            record["eventID"] = hashlib.sha256(name.encode()).hexdigest()[:32]

    return add_and_name


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
        streams = [self.tables[name].stream_shard for name in {name for (name, _), _ in snapshots}]
        streamed = [(stream, len(stream.items)) for stream in streams if stream is not None]
        try:
            return transact_write_items(self, transact_items)
        except (TransactionCanceledException, MultipleTransactionsException, MockValidationException):
            for (table_name, key), before in reversed(snapshots):
                if before is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, before)
            for stream, length in streamed:  # a cancelled transaction leaves nothing in a stream
                del stream.items[length:]
            raise

    return rolled_back


def model_conflicts(handler, hold_seconds: float) -> None:
    """Cancel what DynamoDB would cancel for touching an item a transaction still holds, and
    answer a transaction once it is over (3. in the module docstring). The checks run inside
    the request lock, so ``held`` needs none."""
    from moto.dynamodb.exceptions import DynamodbException, TransactionCanceledException

    class TransactionConflictException(DynamodbException):
        def __init__(self):
            super().__init__(
                "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                "Transaction is ongoing for the item",
            )

    held: dict[str, float] = {}  # item -> when the transaction that last touched it is over
    in_flight = threading.local()  # this request's transaction, until its answer goes out

    def item_id(request, operation: dict) -> str:
        """The item ``operation`` touches, as a key of ``held`` (none: moto refuses it anyway)."""
        return json.dumps(_touched_key(request.dynamodb_backend, operation), sort_keys=True)

    def transact(original):
        def holding(self):
            items = [item_id(self, next(iter(entry.values()))) for entry in self.body["TransactItems"]]
            now = time.monotonic()
            if any(held.get(item, 0) > now for item in items):
                raise TransactionCanceledException(
                    [
                        ("TransactionConflict", "Transaction is ongoing for the item", None)
                        if held.get(item, 0) > now
                        else (None, None, None)
                        for item in items
                    ]
                )
            response = original(self)
            if len(held) > 100_000:
                for item in [item for item, until in held.items() if until <= now]:
                    del held[item]
            held.update(dict.fromkeys(items, now + hold_seconds))
            in_flight.transaction = True
            return response

        return holding

    def answered_when_over(call_action):
        def answer(self):
            in_flight.transaction = False
            response = call_action(self)  # (takes the request lock and gives it back)
            if in_flight.transaction:
                time.sleep(hold_seconds)
            return response

        return answer

    def single(original):
        def refused_while_held(self):
            if held.get(item_id(self, self.body), 0) > time.monotonic():
                raise TransactionConflictException()
            return original(self)

        return refused_while_held

    handler.call_action = answered_when_over(handler.call_action)
    handler.transact_write_items = transact(handler.transact_write_items)
    for name in ("put_item", "update_item", "delete_item"):
        setattr(handler, name, single(getattr(handler, name)))
