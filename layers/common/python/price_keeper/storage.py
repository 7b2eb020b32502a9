"""DynamoDB helpers the metering engine shares: chunked BatchGetItem with retries of
unprocessed keys, and item sizes computed the way DynamoDB bills them."""
from __future__ import annotations

import random
import time
from decimal import Decimal
from typing import Iterable

from boto3.dynamodb.types import TypeDeserializer

from .aws import ddb_client
from .errors import service_unavailable
from .tables import TableSpec

BATCH_GET_LIMIT = 100  # keys per BatchGetItem call
UNPROCESSED_RETRIES = 8

_deserializer = TypeDeserializer()


def plain(raw_item: dict) -> dict:
    """An item in DynamoDB JSON (``{"S": ...}``) as plain Python values (error payloads
    such as ``CancellationReasons`` are not deserialised by boto3)."""
    return {name: _deserializer.deserialize(value) for name, value in raw_item.items()}


def _backoff(attempt: int) -> None:
    time.sleep(min(1.0, 0.02 * 2 ** attempt) * random.uniform(0.5, 1.0))


def batch_get(spec: TableSpec, item_keys: Iterable[dict], *, consistent: bool = False,
              attributes: Iterable[str] | None = None) -> list[dict]:
    """Every existing item among ``item_keys`` (any number; duplicates ignored), in no order.

    Calls BatchGetItem with up to 100 keys and retries unprocessed keys with jittered
    backoff; keys still unprocessed after that make the call a retryable 503.
    """
    unique = list({tuple(sorted(key.items())): key for key in item_keys}.values())
    name = spec.physical_name
    request: dict = {"ConsistentRead": consistent}
    if attributes is not None:
        names = list(dict.fromkeys([spec.partition_key, *([spec.sort_key] if spec.sort_key else []), *attributes]))
        request["ProjectionExpression"] = ", ".join(f"#a{i}" for i in range(len(names)))
        request["ExpressionAttributeNames"] = {f"#a{i}": n for i, n in enumerate(names)}
    found: list[dict] = []
    for start in range(0, len(unique), BATCH_GET_LIMIT):
        pending = {name: {**request, "Keys": unique[start:start + BATCH_GET_LIMIT]}}
        for attempt in range(UNPROCESSED_RETRIES + 1):
            reply = ddb_client().batch_get_item(RequestItems=pending)
            found.extend(reply["Responses"].get(name, []))
            pending = reply.get("UnprocessedKeys") or {}
            if not pending:
                break
            if attempt == UNPROCESSED_RETRIES:
                raise service_unavailable()
            _backoff(attempt)
    return found


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
