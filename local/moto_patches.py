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
4. a table's stream is one shard, so one reader sees every record in order and no two folds
   of a label ever run at once. A busy DynamoDB table's stream has about one shard a
   partition, a record's chosen by its partition key. ``apply(stream_shards=N)`` serves N
   (``_PartitionShard``): each holds the records whose partition key hashes to it, in order,
   with the sequence numbers they have (which grow within a shard, as DynamoDB's do). Off
   (1) by default: the local stack reads one shard.

And one for speed: moto writes each answer out by walking the operation's output model,
attribute by attribute, which is a sixth of a handler test's time. Its answers to item reads
and writes are wire-shaped already (``dynamo_to_dict``), so ``_answer`` writes them as they are,
keeping only the output model's top-level members and sending binaries in base64, as the
walk does (tests/test_moto_patches.py compares the two on every kind of answer).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import threading
import time
import types
import uuid
import zlib

REQUEST_LOCK = threading.RLock()  # every DynamoDB and DynamoDB Streams request holds it (1. above)
_applied = False
_conflicts_modelled = False
_stream_shards = 1


def apply(transaction_hold_ms: float = 0, stream_shards: int = 1) -> None:
    """Patch moto in this process (idempotent); ``transaction_hold_ms`` > 0 also models
    transaction conflicts (3. above), once; ``stream_shards`` > 1 serves each stream as that
    many shards (4. above), once."""
    global _applied, _conflicts_modelled, _stream_shards
    from moto.dynamodb.responses import DynamoHandler

    if not _applied:
        from moto.dynamodb import models as dynamodb_models
        from moto.dynamodb.models import DynamoDBBackend
        from moto.dynamodb.models.table import Table
        from moto.dynamodbstreams.responses import DynamoDBStreamsHandler

        for handler in (DynamoHandler, DynamoDBStreamsHandler):
            handler.call_action = _serialized(handler.call_action)
        DynamoHandler.serialized = _answer(DynamoHandler.serialized)
        DynamoDBBackend.transact_write_items = _rolled_back_per_item(DynamoDBBackend.transact_write_items)
        # moto's own whole-table snapshot becomes the table itself (restoring it is a no-op).
        dynamodb_models.copy = types.SimpleNamespace(
            deepcopy=lambda value, *args: value if isinstance(value, Table) else copy.deepcopy(value, *args)
        )
        _applied = True
    if transaction_hold_ms > 0 and not _conflicts_modelled:
        model_conflicts(DynamoHandler, transaction_hold_ms / 1000)
        _conflicts_modelled = True
    if stream_shards > 1 and _stream_shards == 1:
        partition_streams(stream_shards)
        _stream_shards = stream_shards


def _serialized(call_action):
    def serialized(self):
        with REQUEST_LOCK:
            return call_action(self)

    return serialized


# The answers of item reads and writes: the calls a test or a local run makes by the thousand.
_ITEM_ACTIONS = frozenset(
    {
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "BatchWriteItem",
        "TransactGetItems",
        "TransactWriteItems",
    }
)


def _binary_as_base64(value):
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _answer(serialized):
    """A successful answer's dict as JSON, without walking the output model (5. above)."""
    from moto.core.utils import get_service_model

    @functools.wraps(serialized)
    def answer(self, action_result):
        result, action = action_result.result, self._get_action()
        if action not in _ITEM_ACTIONS or not isinstance(result, dict):  # an error, or a table's answer
            return serialized(self, action_result)
        members = get_service_model("dynamodb").operation_model(action).output_shape.members
        body = json.dumps({name: value for name, value in result.items() if name in members}, default=_binary_as_base64)
        return 200, {"Content-Type": "application/x-amz-json-1.0", **self.response_headers}, body

    return answer


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


def _shard_of(keys: dict, hash_key: str, shards: int) -> int:
    """The stream shard of a record: its partition key's, as DynamoDB routes one key to one shard."""
    return zlib.crc32(json.dumps(keys[hash_key], sort_keys=True).encode()) % shards


class _PartitionShard:
    """Shard ``number`` of ``count`` of a table's one moto stream: the records whose partition
    key hashes to it, in order, with their own sequence numbers."""

    def __init__(self, stream, number: int, count: int):
        self.stream, self.number, self.count = stream, number, count
        self.table = stream.table
        self.id = f"shardId-{count:020d}-{number:08x}"  # (botocore: 28 characters at least)

    def to_json(self) -> dict:
        start = str(self.stream.starting_sequence_number)
        return {"ShardId": self.id, "SequenceNumberRange": {"StartingSequenceNumber": start}}

    def read(self, position: int, limit: int) -> tuple[list[dict], int]:
        """Up to ``limit`` of this shard's records from the stream's ``position`` on (an
        index into it), and the position after the last record looked at."""
        found = []
        items = self.stream.items
        while position < len(items) and len(found) < limit:
            record = items[position].record
            if _shard_of(record["dynamodb"]["Keys"], self.table.hash_key_attr, self.count) == self.number:
                found.append(items[position].to_json())
            position += 1
        return found, position


class _PartitionIterator:
    """A shard iterator of a ``_PartitionShard``: where in the table's stream it reads on."""

    def __init__(self, backend, shard: _PartitionShard, position: int):
        self.backend, self.shard, self.position = backend, shard, position
        self.arn = f"{shard.table.table_arn}/stream/{shard.table.latest_stream_label}|1|{uuid.uuid4().hex}"
        backend.shard_iterators[self.arn] = self

    def get(self, limit: int = 1000) -> dict:
        records, position = self.shard.read(self.position, limit)
        return {"NextShardIterator": _PartitionIterator(self.backend, self.shard, position).arn, "Records": records}


def partition_streams(count: int) -> None:
    """Serve every table's stream as ``count`` shards (4. in the module docstring)."""
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend

    describe = DynamoDBStreamsBackend.describe_stream

    def shards(table) -> list[_PartitionShard]:
        return [_PartitionShard(table.stream_shard, n, count) for n in range(count)] if table.stream_shard else []

    def describe_stream(self, arn: str) -> dict:
        stream = describe(self, arn)
        stream["Shards"] = [shard.to_json() for shard in shards(self._get_table_from_arn(arn))]
        return stream

    def get_shard_iterator(self, arn: str, shard_id: str, shard_iterator_type: str, sequence_number=None):
        table = self._get_table_from_arn(arn)
        (shard,) = [shard for shard in shards(table) if shard.id == shard_id]
        start = table.stream_shard.starting_sequence_number
        position = {
            "TRIM_HORIZON": 0,
            "LATEST": len(table.stream_shard.items),
            "AT_SEQUENCE_NUMBER": int(sequence_number or start) - start,
            "AFTER_SEQUENCE_NUMBER": int(sequence_number or start) - start + 1,
        }[shard_iterator_type]
        return _PartitionIterator(self, shard, position)

    DynamoDBStreamsBackend.describe_stream = describe_stream
    DynamoDBStreamsBackend.get_shard_iterator = get_shard_iterator
