"""The seven DynamoDB tables of the schema seed: one definition for the CDK stack,
the local stack and the code that reads and writes them.

A table's physical name comes from the environment variable named by ``env`` (the
stack sets it on every function) or, when unset, from ``TABLE_PREFIX`` + ``name``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TTL_ATTRIBUTE = "expires_at_epoch"
DEFAULT_TABLE_PREFIX = "price-keeper-"


@dataclass(frozen=True)
class Index:
    name: str
    partition_key: str
    sort_key: str | None = None
    projection: str = "KEYS_ONLY"


@dataclass(frozen=True)
class TableSpec:
    name: str
    env: str
    partition_key: str
    sort_key: str | None = None
    ttl_attribute: str | None = TTL_ATTRIBUTE
    holds_money: bool = False
    indexes: tuple[Index, ...] = ()
    stream: str | None = None  # StreamViewType the service reads (the usage table: the aggregator's trigger)

    @property
    def physical_name(self) -> str:
        return os.environ.get(self.env) or os.environ.get("TABLE_PREFIX", DEFAULT_TABLE_PREFIX) + self.name

    def key_schema(self) -> list[dict]:
        schema = [{"AttributeName": self.partition_key, "KeyType": "HASH"}]
        if self.sort_key:
            schema.append({"AttributeName": self.sort_key, "KeyType": "RANGE"})
        return schema

    def attribute_names(self) -> list[str]:
        names = [self.partition_key] + ([self.sort_key] if self.sort_key else [])
        for index in self.indexes:
            names += [index.partition_key] + ([index.sort_key] if index.sort_key else [])
        return list(dict.fromkeys(names))

    def create_table_kwargs(self) -> dict:
        """Arguments for ``CreateTable`` (local stack and tests)."""
        kwargs = {
            "TableName": self.physical_name,
            "KeySchema": self.key_schema(),
            "AttributeDefinitions": [{"AttributeName": n, "AttributeType": "S"} for n in self.attribute_names()],
            "BillingMode": "PAY_PER_REQUEST",
        }
        if self.indexes:
            kwargs["GlobalSecondaryIndexes"] = [
                {
                    "IndexName": index.name,
                    "KeySchema": [{"AttributeName": index.partition_key, "KeyType": "HASH"}]
                    + ([{"AttributeName": index.sort_key, "KeyType": "RANGE"}] if index.sort_key else []),
                    "Projection": {"ProjectionType": index.projection},
                }
                for index in self.indexes
            ]
        if self.stream:
            kwargs["StreamSpecification"] = self.stream_specification()
        return kwargs

    def stream_specification(self) -> dict:
        return {"StreamEnabled": True, "StreamViewType": self.stream}


# Sparse index over usage shard items: a shard item carries ``active_day`` (its
# ``DAY#yyyymmdd#{bucket}``, ``keys.active_day_key``) so the aggregator finds the scopes
# active on a day with a Query per bucket, without scanning and without visiting orgs that
# sent nothing that day.
ACTIVE_BY_DAY = Index(name="active-by-day", partition_key="active_day", sort_key="shard_key")

CONFIG = TableSpec("config", "CONFIG_TABLE", "org_key", "resource_key", holds_money=True)
STICKY_STATE = TableSpec("sticky-state", "STICKY_STATE_TABLE", "scope_key", "date_key")
# Its stream names the shards each usage write changed (the shard fold sums the shards
# themselves, so a record delivered twice changes nothing) and carries the dedup markers'
# images, which the ledger folds (``domain.ledger``).
USAGE_AGG_SHARDED = TableSpec(
    "usage-agg-sharded",
    "USAGE_AGG_SHARDED_TABLE",
    "shard_key",
    "date_key",
    holds_money=True,
    indexes=(ACTIVE_BY_DAY,),
    stream="NEW_AND_OLD_IMAGES",
)
DAILY_TOTAL = TableSpec("daily-total", "DAILY_TOTAL_TABLE", "usage_key", "date_key", holds_money=True)
PRICING_CACHE = TableSpec("pricing-cache", "PRICING_CACHE_TABLE", "model_id", "price_key")
REVOKED_TOKENS = TableSpec("revoked-tokens", "REVOKED_TOKENS_TABLE", "token_jti")
# Deprecated by the schema seed (secrets are returned directly); kept so the deployed
# schema matches the seed's seven tables. Nothing reads or writes it.
SECRET_RETRIEVAL_TOKENS = TableSpec("secret-retrieval-tokens", "SECRET_RETRIEVAL_TOKENS_TABLE", "token_id")

ALL_TABLES: tuple[TableSpec, ...] = (
    CONFIG,
    STICKY_STATE,
    USAGE_AGG_SHARDED,
    DAILY_TOTAL,
    PRICING_CACHE,
    REVOKED_TOKENS,
    SECRET_RETRIEVAL_TOKENS,
)
