"""The one DynamoDB connection and the helpers every table module shares: table handles,
paginated queries, conditional writes, chunked BatchGetItem over one or several tables with
retries of unprocessed keys, the error codes worth retrying, and item sizes computed the
way DynamoDB bills them.

``DYNAMODB_ENDPOINT_URL`` points DynamoDB elsewhere (the local stack, DynamoDB Local).
Nothing is created at import time, so handler modules import with no environment set.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from functools import lru_cache
from typing import NamedTuple

import boto3
from boto3.dynamodb.types import Binary, TypeDeserializer
from botocore.exceptions import ClientError

from .. import state
from ..aws import RETRIES
from ..errors import error_code, service_unavailable
from .tables import TableSpec

BATCH_GET_LIMIT = 100  # keys per BatchGetItem call
UNPROCESSED_RETRIES = 8
# CancellationReasons codes of a TransactWriteItems that is worth retrying.
TRANSACTION_RETRYABLE_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})

_deserializer = TypeDeserializer()


@lru_cache(maxsize=1)
def dynamodb():
    """The DynamoDB service resource (its ``meta.client`` takes and returns plain Python values)."""
    return boto3.resource("dynamodb", endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL") or None, config=RETRIES)


def ddb_client():
    """Low-level client with the resource's type (de)serialisation: batch and transaction calls."""
    return dynamodb().meta.client


@lru_cache(maxsize=16)  # one per table (seven)
def _table(name: str):
    return dynamodb().Table(name)


def table(spec: TableSpec):
    return _table(spec.physical_name)


@state.kept
def forget_connections() -> None:
    """Drop the resource and table handles (tests switch endpoints and credentials)."""
    dynamodb.cache_clear()
    _table.cache_clear()


QUERY_THREADS = 8  # concurrent Queries or BatchGetItems of one request (a report over many usage keys)


def query_many(run_query: Callable[..., list], arguments: Sequence) -> list[list]:
    """``run_query(client, argument)`` for every argument, concurrently, in order (Queries,
    or the BatchGetItems of a large read). The client is built here, once, and shared (boto3
    clients are thread-safe; building one is not)."""
    client = ddb_client()
    with ThreadPoolExecutor(max_workers=QUERY_THREADS) as pool:
        return list(pool.map(lambda argument: run_query(client, argument), arguments))


def query_pages(query, **kwargs) -> Iterator[list[dict]]:
    """The items of a Query a page at a time, following ``LastEvaluatedKey`` (``query`` is a
    Table's or a client's ``query`` method)."""
    while True:
        page = query(**kwargs)
        yield page["Items"]
        if "LastEvaluatedKey" not in page:
            return
        kwargs = {**kwargs, "ExclusiveStartKey": page["LastEvaluatedKey"]}


def query_all(query, **kwargs) -> list[dict]:
    """Every item a Query returns (``query_pages`` joined)."""
    return [item for page in query_pages(query, **kwargs) for item in page]


class ConditionFailed(Exception):
    """A conditional write found its condition false; ``item`` is the stored item (plain
    values) when the call asked for it with ``ReturnValuesOnConditionCheckFailure``."""

    def __init__(self, item: dict | None):
        super().__init__("condition failed")
        self.item = item


def conditional(call: Callable[..., dict], **kwargs) -> dict:
    """The reply of a conditional PutItem / UpdateItem / DeleteItem; ``ConditionFailed``
    when its condition is false (any other error propagates)."""
    try:
        return call(**kwargs)
    except ClientError as error:
        if error_code(error) != "ConditionalCheckFailedException":
            raise
        raw = error.response.get("Item")
        raise ConditionFailed(plain(raw) if raw else None) from None


def written(call: Callable[..., dict], **kwargs) -> bool:
    """``conditional`` for callers that only need to know whether the write happened."""
    try:
        conditional(call, **kwargs)
        return True
    except ConditionFailed:
        return False


def transact(items: list[dict], **kwargs) -> list[dict] | None:
    """TransactWriteItems: None when it committed; its ``CancellationReasons`` (stored items
    as plain values) when it was cancelled by a failed condition or a retryable conflict.
    Any other error propagates."""
    try:
        ddb_client().transact_write_items(TransactItems=items, **kwargs)
        return None
    except ClientError as error:
        if error_code(error) != "TransactionCanceledException":
            raise
        reasons = error.response.get("CancellationReasons") or [{}]
        codes = {reason.get("Code") for reason in reasons}
        if "ConditionalCheckFailed" not in codes and not TRANSACTION_RETRYABLE_REASONS & codes:
            raise
        return [{**reason, "Item": plain(reason["Item"])} if "Item" in reason else reason for reason in reasons]


def plain(raw_item: dict) -> dict:
    """An item in DynamoDB JSON (``{"S": ...}``) as plain Python values (error payloads
    such as ``CancellationReasons`` are not deserialised by boto3)."""
    return {name: _deserializer.deserialize(value) for name, value in raw_item.items()}


def _backoff(attempt: int) -> None:
    time.sleep(min(1.0, 0.02 * 2**attempt) * random.uniform(0.5, 1.0))


def projection(attributes: Iterable[str]) -> dict:
    """``ProjectionExpression`` and its ``ExpressionAttributeNames`` for reading only
    ``attributes`` (each named by a placeholder, so reserved words such as ``ttl`` work)."""
    names = list(dict.fromkeys(attributes))
    return {
        "ProjectionExpression": ", ".join(f"#a{i}" for i in range(len(names))),
        "ExpressionAttributeNames": {f"#a{i}": name for i, name in enumerate(names)},
    }


class Read(NamedTuple):
    """Keys to read from one table, optionally only some attributes (keys always come back)."""

    spec: TableSpec
    keys: Sequence[dict]
    attributes: Sequence[str] | None = None
    consistent: bool | None = None  # None: as the call says (``batch_get_many``)

    def request(self, consistent: bool) -> dict:
        request: dict = {"ConsistentRead": consistent if self.consistent is None else self.consistent}
        if self.attributes is not None:
            spec = self.spec
            request.update(
                projection([spec.partition_key, *([spec.sort_key] if spec.sort_key else []), *self.attributes])
            )
        return request


class ReadAlong(NamedTuple):
    """A read that another one carries in its BatchGetItem (a cold container's config, with
    its token check), and what to do with the items it found."""

    read: Read
    found: Callable[[list[dict]], None]


def batch_get_many(reads: Sequence[Read], *, consistent: bool = False) -> list[list[dict]]:
    """The existing items of each read (one list per read, in no order), fetched together:
    one BatchGetItem for up to 100 keys over all tables, so a request that needs a few
    items of several tables pays one round trip.

    Duplicate keys are read once; more than 100 keys are read by up to 8 calls at once;
    unprocessed keys are retried with jittered backoff, and keys still unprocessed after
    that make the call a retryable 503.
    """
    names = [read.spec.physical_name for read in reads]
    if len(set(names)) != len(names):
        raise ValueError("one Read per table")
    requests = {name: read.request(consistent) for name, read in zip(names, reads, strict=True)}
    pairs = list(
        {
            (name, tuple(sorted(key.items()))): (name, key)
            for name, read in zip(names, reads, strict=True)
            for key in read.keys
        }.values()
    )

    def read_chunk(client, chunk: list[tuple[str, dict]]) -> list[tuple[str, list[dict]]]:
        pending: dict = {}
        for name, key in chunk:
            pending.setdefault(name, {**requests[name], "Keys": []})["Keys"].append(key)
        got = []
        for attempt in range(UNPROCESSED_RETRIES + 1):
            reply = client.batch_get_item(RequestItems=pending)
            got += reply["Responses"].items()
            pending = reply.get("UnprocessedKeys") or {}
            if not pending:
                break
            if attempt == UNPROCESSED_RETRIES:
                raise service_unavailable()
            _backoff(attempt)
        return got

    chunks = [pairs[start : start + BATCH_GET_LIMIT] for start in range(0, len(pairs), BATCH_GET_LIMIT)]
    if len(chunks) > 1:  # more than 100 keys: the calls at once (an org of many apps, a fold of many labels)
        replies = query_many(read_chunk, chunks)
    else:  # the usual request's read: no pool
        replies = [read_chunk(ddb_client(), chunk) for chunk in chunks]
    found: dict[str, list[dict]] = {name: [] for name in names}
    for got in replies:
        for name, items in got:
            found[name].extend(items)
    return [found[name] for name in names]


def batch_get(
    spec: TableSpec, item_keys: Iterable[dict], *, consistent: bool = False, attributes: Iterable[str] | None = None
) -> list[dict]:
    """Every existing item of one table among ``item_keys`` (any number), in no order."""
    read = Read(spec, list(item_keys), None if attributes is None else list(attributes))
    return batch_get_many([read], consistent=consistent)[0]


# --- item size (what a write or read is billed on) ---------------------------------


def _number_size(value) -> int:
    digits = Decimal(value).normalize().as_tuple().digits
    significant = len(digits) if any(digits) else 1
    return (significant + 1) // 2 + 1


def value_size(value) -> int:
    """Bytes DynamoDB counts for one attribute value (its name excluded)."""
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, Binary):
        return len(value.value)
    if isinstance(value, (int, float, Decimal)):
        return _number_size(value)
    if isinstance(value, (set, frozenset)):
        return sum(value_size(element) for element in value)
    if isinstance(value, (list, tuple)):
        return 3 + sum(value_size(element) + 1 for element in value)
    if isinstance(value, dict):
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in value.items())
    raise TypeError(f"not a DynamoDB value: {type(value).__name__}")


def item_size(item: dict) -> int:
    """Item size in bytes as DynamoDB defines it: attribute names plus values."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())
