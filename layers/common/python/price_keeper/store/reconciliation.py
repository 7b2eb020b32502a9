"""DailyTotal, for reconciliation: the label totals of the org days around a UTC day (with
their hour marks), the day's result item (``#RECONCILIATION`` / ``RECON#{yyyymmdd}``) and
its bill comparison (``#RECONCILIATION`` / ``BILL#{yyyymmdd}``)."""

from __future__ import annotations

from collections.abc import Iterable

from . import keys, tables, usage
from .dynamo import batch_get, table

# What a label total's hour mark holds, in this order: its sums as of the last fold of the hour.
MARK_FIELDS = ("requests", "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_write_input_tokens")


def mark_value(sums: dict) -> list[int]:
    return [int(sums.get(name, 0)) for name in MARK_FIELDS]


def label_totals(org_days: Iterable[str]) -> list[dict]:
    """Every label total (whole items: counters and hour marks) of the org days ``yyyymmdd``:
    the labels come from the shards' ``active-by-day`` index (``usage.active_shard_keys``)."""
    wanted = {
        (keys.usage_key_of_shard(shard["shard_key"]), shard["date_key"])
        for day in org_days
        for shard in usage.active_shard_keys(day)
    }
    return batch_get(tables.DAILY_TOTAL, [{"usage_key": u, "date_key": d} for u, d in sorted(wanted)])


def put_result(day: str, result: dict, expires_at: int) -> None:
    table(tables.DAILY_TOTAL).put_item(
        Item={**keys.reconciliation_key(day), **result, tables.TTL_ATTRIBUTE: expires_at}
    )


BILL_PAGE_PROFILES = 1_000  # profile rows an item (~130 KB; one item takes 400 KB)


def put_bill(day: str, result: dict, expires_at: int) -> None:
    """The bill comparison of a UTC day: its ``profiles`` rows in pages of
    ``BILL_PAGE_PROFILES`` (a fleet's tagged profiles outgrow one item), then the rest of
    ``result`` with how many rows and pages there are (written last: a summary read names
    pages that are all there)."""
    rows = result["profiles"]
    pages = [rows[start : start + BILL_PAGE_PROFILES] for start in range(0, len(rows), BILL_PAGE_PROFILES)]
    totals = table(tables.DAILY_TOTAL)
    for number, page in enumerate(pages):
        totals.put_item(Item={**keys.bill_page_key(day, number), "profiles": page, tables.TTL_ATTRIBUTE: expires_at})
    summary = {name: value for name, value in result.items() if name != "profiles"}
    totals.put_item(
        Item={
            **keys.bill_key(day),
            **summary,
            "profile_count": len(rows),
            "pages": len(pages),
            tables.TTL_ATTRIBUTE: expires_at,
        }
    )


def get_result(day: str) -> dict | None:
    return table(tables.DAILY_TOTAL).get_item(Key=keys.reconciliation_key(day)).get("Item")
