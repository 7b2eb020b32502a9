"""DynamoDB helpers the metering engine shares: chunked BatchGetItem over one or several
tables with retries of unprocessed keys, and item sizes computed the way DynamoDB bills them."""
from __future__ import annotations

import random
import time
from decimal import Decimal
from typing import Iterable, NamedTuple, Sequence

from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import BotoCoreError, ClientError

from .aws import ddb_client
from .errors import service_unavailable
from .tables import TableSpec

BATCH_GET_LIMIT = 100  # keys per BatchGetItem call
UNPROCESSED_RETRIES = 8
# CancellationReasons codes of a TransactWriteItems that is worth retrying.
# DynamoDB error codes that mean "try again" (answered as a 503 with Retry-After).
RETRYABLE_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "ServiceUnavailable", "TransactionConflictException",
})
TRANSACTION_RETRYABLE_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})

_deserializer = TypeDeserializer()


def error_code(error: ClientError | BotoCoreError) -> str:
    """The AWS error code of a failed call (``Unreachable`` when the store never answered)."""
    return error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else "Unreachable"


def is_retryable(error: ClientError | BotoCoreError) -> bool:
    """A throttled, busy or unreachable store: the same request may succeed later."""
    return isinstance(error, BotoCoreError) or error_code(error) in RETRYABLE_CODES


def plain(raw_item: dict) -> dict:
    """An item in DynamoDB JSON (``{"S": ...}``) as plain Python values (error payloads
    such as ``CancellationReasons`` are not deserialised by boto3)."""
    return {name: _deserializer.deserialize(value) for name, value in raw_item.items()}


def _backoff(attempt: int) -> None:
    time.sleep(min(1.0, 0.02 * 2 ** attempt) * random.uniform(0.5, 1.0))


class Read(NamedTuple):
    """Keys to read from one table, optionally only some attributes (keys always come back)."""

    spec: TableSpec
    keys: Sequence[dict]
    attributes: Sequence[str] | None = None

    def request(self, consistent: bool) -> dict:
        request: dict = {"ConsistentRead": consistent}
        if self.attributes is not None:
            spec = self.spec
            names = list(dict.fromkeys([spec.partition_key, *([spec.sort_key] if spec.sort_key else []),
                                        *self.attributes]))
            request["ProjectionExpression"] = ", ".join(f"#a{i}" for i in range(len(names)))
            request["ExpressionAttributeNames"] = {f"#a{i}": n for i, n in enumerate(names)}
        return request


def batch_get_many(reads: Sequence[Read], *, consistent: bool = False) -> list[list[dict]]:
    """The existing items of each read (one list per read, in no order), fetched together:
    one BatchGetItem for up to 100 keys over all tables, so a request that needs a few
    items of several tables pays one round trip.

    Duplicate keys are read once; unprocessed keys are retried with jittered backoff, and
    keys still unprocessed after that make the call a retryable 503.
    """
    names = [read.spec.physical_name for read in reads]
    if len(set(names)) != len(names):
        raise ValueError("one Read per table")
    requests = {name: read.request(consistent) for name, read in zip(names, reads)}
    pairs = list({(name, tuple(sorted(key.items()))): (name, key)
                  for name, read in zip(names, reads) for key in read.keys}.values())
    found: dict[str, list[dict]] = {name: [] for name in names}
    for start in range(0, len(pairs), BATCH_GET_LIMIT):
        pending: dict = {}
        for name, key in pairs[start:start + BATCH_GET_LIMIT]:
            pending.setdefault(name, {**requests[name], "Keys": []})["Keys"].append(key)
        for attempt in range(UNPROCESSED_RETRIES + 1):
            reply = ddb_client().batch_get_item(RequestItems=pending)
            for name, items in reply["Responses"].items():
                found[name].extend(items)
            pending = reply.get("UnprocessedKeys") or {}
            if not pending:
                break
            if attempt == UNPROCESSED_RETRIES:
                raise service_unavailable()
            _backoff(attempt)
    return [found[name] for name in names]


def batch_get(spec: TableSpec, item_keys: Iterable[dict], *, consistent: bool = False,
              attributes: Iterable[str] | None = None) -> list[dict]:
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
