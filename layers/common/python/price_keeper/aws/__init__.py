"""The AWS services other than DynamoDB (``store/`` owns that): the only code that calls them
and reads their answers (the Price List, Bedrock's control plane, CloudWatch, Cost Explorer,
EventBridge, SQS, Secrets Manager), on lazily built clients reused across warm invocations;
nothing is created at import time."""

from __future__ import annotations

from functools import lru_cache

import boto3
from botocore.config import Config

from .. import state

RETRIES = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=2, read_timeout=5)


@lru_cache(maxsize=8)  # one per service the layer calls (a handful)
def client(service: str):
    return boto3.client(service, config=RETRIES)


state.kept(client.cache_clear)


def stack_region() -> str:
    """The Region the service runs in (its clients')."""
    return client("cloudwatch").meta.region_name
