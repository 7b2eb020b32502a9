"""Lazily built AWS clients, reused across warm invocations.

Nothing is created at import time, so handler modules import with no environment set.
``DYNAMODB_ENDPOINT_URL`` points DynamoDB elsewhere (the local stack, DynamoDB Local);
other services follow boto3's own ``AWS_ENDPOINT_URL``.
"""
from __future__ import annotations

import os
from functools import lru_cache

import boto3
from botocore.config import Config

from .tables import TableSpec

_RETRIES = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=2, read_timeout=5)


@lru_cache(maxsize=1)
def dynamodb():
    """The DynamoDB service resource (its ``meta.client`` takes and returns plain Python values)."""
    return boto3.resource("dynamodb", endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL") or None, config=_RETRIES)


def ddb_client():
    """Low-level client with the resource's type (de)serialisation: batch and transaction calls."""
    return dynamodb().meta.client


@lru_cache(maxsize=None)
def _table(name: str):
    return dynamodb().Table(name)


def table(spec: TableSpec):
    return _table(spec.physical_name)


@lru_cache(maxsize=None)
def client(service: str):
    return boto3.client(service, config=_RETRIES)


def reset() -> None:
    """Forget every client (tests switch endpoints and credentials between cases)."""
    dynamodb.cache_clear()
    _table.cache_clear()
    client.cache_clear()


def query_all(query, **kwargs) -> list[dict]:
    """Every item a Query returns, following ``LastEvaluatedKey`` (``query`` is a Table's or
    a client's ``query`` method)."""
    items: list[dict] = []
    while True:
        page = query(**kwargs)
        items.extend(page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs = {**kwargs, "ExclusiveStartKey": page["LastEvaluatedKey"]}
