"""Helpers of the metering tests: a seeded tenant with a real token, usage bodies, and
reading what the metering wrote."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from price_keeper.bodies import UsageRequest
from price_keeper.config import get_config
from price_keeper.domain import aggregation, ledger, metering
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import query_all, table
from tests.factories import seed_app, seed_org, token_for


@dataclass
class Tenant:
    org_id: str
    app_id: str
    token: str
    org_token: str
    quota_scope: str

    @property
    def app_path(self) -> str:
        return f"/api/v1/orgs/{self.org_id}/apps/{self.app_id}"

    @property
    def org_path(self) -> str:
        return f"/api/v1/orgs/{self.org_id}"

    @property
    def scope(self) -> str:
        return keys.scope_key(self.org_id, self.app_id, self.quota_scope)


def new_tenant(app_id: str = "app-1", app_overrides: dict | None = None, **org_settings) -> Tenant:
    org_id = seed_org(**org_settings)
    seed_app(org_id, app_id, **(app_overrides or {}))
    return Tenant(org_id, app_id, token_for(org_id, app_id), token_for(org_id), org_settings.get("quota_scope", "APP"))


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ZONES = ("America/New_York", "Asia/Tokyo", "Europe/London", "Australia/Sydney")


def zone_away_from_midnight() -> str:
    """A timezone whose local time is far from midnight now (01:00-22:00), so a test of the
    day rules is never inside the after-midnight grace or about to cross a day."""
    now = datetime.now(UTC)
    return next(zone for zone in ZONES if 1 <= now.astimezone(ZoneInfo(zone)).hour < 22)


def usage_body(request_id: str | None = None, **fields) -> dict:
    body = {
        "request_id": request_id or str(uuid.uuid4()),
        "model_label": "premium",
        "bedrock_model_id": "amazon.nova-pro-v1:0",
        "input_tokens": 1500,
        "output_tokens": 800,
        "status": "OK",
        "timestamp": iso(datetime.now(UTC) - timedelta(seconds=5)),
    }
    body.update(fields)
    if "bedrock_model_id" not in fields and body["model_label"] in get_config().labels:
        body["bedrock_model_id"] = get_config().labels[body["model_label"]].id  # what its label names
    return body


def fold_usage(now: datetime | None = None) -> aggregation.RunReport:
    """Fold everything the usage stream holds, shard by shard, as the aggregator does
    (``ledger.fold_batch``, without the handler's alerts; a record folded before is skipped
    by its shard's progress): what the folds report."""
    from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

    from local.streams import StreamReader, lambda_event

    report = aggregation.RunReport(days=[])
    for shard_id, records in StreamReader(tables.USAGE_AGG_SHARDED).read().items():
        report.merge(
            ledger.fold_batch(DynamoDBStreamEvent(lambda_event(records, shard_id)).records, shard_id, now).report
        )
    return report


def submit_and_fold(org_id: str, app_id: str, arrives: datetime, **fields) -> None:
    """A usage record (``usage_body`` with ``fields``) that reaches the service at ``arrives``
    and is folded by the aggregator a second later."""
    metering.submit(org_id, app_id, UsageRequest(**usage_body(**fields)), arrives)
    fold_usage(arrives + timedelta(seconds=1))


# One record of exactly $1.00 of premium (0.80 input + 0.20 output), inside the per-record token caps.
PREMIUM_DOLLAR = {"input_tokens": 1_000_000, "output_tokens": 62_500}


def output_chunks(output_tokens: int) -> list[int]:
    """``output_tokens`` split into records no larger than the default per-record cap."""
    cap = get_config().metering.max_output_tokens
    return [min(cap, output_tokens - start) for start in range(0, output_tokens, cap)] or [0]


def all_items(spec) -> list[dict]:
    """Every item of a table (test inspection only; the service never scans)."""
    return query_all(table(spec).scan)  # follows LastEvaluatedKey for scans too


def shard_items(scope: str | None = None) -> list[dict]:
    return [
        item
        for item in all_items(tables.USAGE_AGG_SHARDED)
        if item["date_key"].startswith(keys.day_key(""))
        and (scope is None or item["shard_key"].startswith(scope + "#LABEL#"))
    ]


def marker_of(org_id: str, app_id: str, request_id: str) -> dict:
    """The key of a record's marker in a seeded org (``agg_shard_count`` 8)."""
    return keys.marker_key(org_id, app_id, request_id, 8)


def dedup_items() -> list[dict]:
    return [item for item in all_items(tables.USAGE_AGG_SHARDED) if keys.is_marker(item["date_key"])]


def daily_total(scope: str, label: str, day: str) -> dict | None:
    return (
        table(tables.DAILY_TOTAL)
        .get_item(Key={"usage_key": keys.usage_key(scope, label), "date_key": keys.day_key(day)})
        .get("Item")
    )


def put_records(scope: str, label: str, *, day: str, cost: int = 100, requests: int = 1) -> None:
    """``requests`` usage records of ``label`` counted in ``scope`` on org day ``day``
    (``yyyymmdd``), ``cost`` micro-USD together, as markers in the shape the metering writes
    them (for the aggregator's fold: ``fold_usage`` or the ``fold_stream`` fixture)."""
    org_id, app_id = keys.split_scope(scope)
    costs = [cost // requests] * requests
    costs[0] += cost - sum(costs)
    for each in costs:
        table(tables.USAGE_AGG_SHARDED).put_item(
            Item={
                **keys.marker_key(org_id, app_id or "app-1", str(uuid.uuid4()), 8),
                "model_label": label,
                "org_day": day,
                "shard_id": 0,
                "scopes": [scope],
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_read_input_tokens": 0,
                "cache_write_input_tokens": 0,
                "cost_usd_micros": each,
                "price_source": "CONFIG_FALLBACK",
                "profile_kind": "IN_REGION",
                "accepted_at_epoch": int(datetime.now(UTC).timestamp()),
                "expires_at_epoch": 2_000_000_000,
            }
        )


def spent_labels(scope: str, day: str) -> set[str]:
    """Every label a scope-day lists (what aggregates and reports show beside the ordering):
    those in its scope total's set and those in items of their own."""
    from price_keeper.store import daily_totals

    on = datetime.strptime(day, "%Y%m%d").date()
    scope_total = (
        table(tables.DAILY_TOTAL)
        .get_item(Key={"usage_key": keys.scope_total_key(scope), "date_key": keys.day_key(day)})
        .get("Item", {})
    )
    return set(scope_total.get(daily_totals.LABELS, ())) | daily_totals.spent_labels([scope], on, on)[0]
