"""DailyTotal, for reconciliation: the label totals of the org days around a UTC day (with
their hour marks), the day's result item (``#RECONCILIATION`` / ``RECON#{yyyymmdd}``) and
its bill comparison (``#RECONCILIATION`` / ``BILL#{yyyymmdd}``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from . import keys, tables, usage
from .dynamo import batch_get, table

# What a label total's hour mark holds, in this order: its sums as of the last fold of the hour.
MARK_FIELDS = ("requests", "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_write_input_tokens")


def _varint(number: int) -> bytes:
    """``number`` zigzagged (0, -1, 1, -2, ... as 0, 1, 2, 3, ...: a negative mark, which a
    void folded before its record would make, is a number like any other) in 7-bit groups,
    low first, the high bit set on all but the last."""
    number = 2 * number if number >= 0 else -2 * number - 1
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        if not number:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _varints(blob: bytes) -> Iterator[int]:
    number = shift = 0
    for byte in blob:
        number |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            yield number >> 1 if number % 2 == 0 else -(number + 1) // 2
            number = shift = 0


def pack_marks(marks: dict[int, list[int]]) -> bytes:
    """Hour marks (UTC hours since the epoch -> ``MARK_FIELDS`` values) as one binary value:
    each mark its hour and its values as varints, ~19 bytes a mark where an attribute of its
    own took ~41. So a label total folded in every hour of its day stays under 1 KB (one
    write unit a fold, not two)."""
    return b"".join(_varint(hour) + b"".join(map(_varint, marks[hour])) for hour in sorted(marks))


def unpack_marks(blob) -> dict[int, list[int]]:
    numbers = list(_varints(bytes(getattr(blob, "value", blob) or b"")))
    width = 1 + len(MARK_FIELDS)
    return {numbers[i]: numbers[i + 1 : i + width] for i in range(0, len(numbers) - width + 1, width)}


def with_mark(stored: dict, now: datetime, sums: dict) -> bytes:
    """A label total's packed marks with this hour's mark set to ``sums``."""
    marks = unpack_marks(stored.get(keys.HOUR_MARKS))
    marks[int(now.timestamp()) // 3600] = [int(sums.get(name, 0)) for name in MARK_FIELDS]
    return pack_marks(marks)


def marks_of(item: dict) -> list[tuple[str, list[int]]]:
    """Every hour mark of a label total as (``yyyymmddHH``, values), by hour."""
    return [
        (datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y%m%d%H"), values)
        for hour, values in sorted(unpack_marks(item.get(keys.HOUR_MARKS)).items())
    ]


TOTALS_AT_ONCE = 800  # label totals read together: 8 BatchGetItem of 100, concurrently


def label_totals(org_days: Iterable[str]) -> Iterator[list[dict]]:
    """Every label total (whole items: counters and hour marks) of the org days ``yyyymmdd``,
    a few hundred at a time: the labels come from the ``active-by-day`` index
    (``usage.day_listed``), one partition key and Query page at a time, so a fleet's days
    (~300,000 label-days each) are read in bounded memory, with the totals' reads concurrent
    (``dynamo.batch_get_many``)."""
    for day in org_days:
        for active_day in keys.active_day_keys(day):
            for page in usage.active_label_day_pages(active_day):
                wanted = [{"usage_key": entry["shard_key"], "date_key": entry["date_key"]} for entry in page]
                for start in range(0, len(wanted), TOTALS_AT_ONCE):
                    yield batch_get(tables.DAILY_TOTAL, wanted[start : start + TOTALS_AT_ONCE])


# Rows an item of a kept result: a model's ~350 B, a tagged profile's ~130 B (one item takes
# 400 KB, and a fleet's application profiles are thousands of rows a day).
PAGE_ROWS = 500


def put_result(day: str, result: dict, expires_at: int) -> None:
    """A UTC day's reconciliation, its ``models`` rows in pages."""
    _put_paged(keys.reconciliation_key(day), "models", result, expires_at)


def put_bill(day: str, result: dict, expires_at: int) -> None:
    """A UTC day's bill comparison, its ``profiles`` rows in pages."""
    _put_paged(keys.bill_key(day), "profiles", result, expires_at)


def _put_paged(key: dict, rows_name: str, result: dict, expires_at: int) -> None:
    """``result``'s ``rows_name`` rows in pages of ``PAGE_ROWS`` (``keys.page_key``), then
    the rest of it under ``key`` with how many rows and pages there are (written last, so a
    read of it names pages that are all there)."""
    rows = result[rows_name]
    pages = [rows[start : start + PAGE_ROWS] for start in range(0, len(rows), PAGE_ROWS)]
    totals = table(tables.DAILY_TOTAL)
    for number, page in enumerate(pages):
        totals.put_item(Item={**keys.page_key(key, number), rows_name: page, tables.TTL_ATTRIBUTE: expires_at})
    summary = {name: value for name, value in result.items() if name != rows_name}
    totals.put_item(Item={**key, **summary, "rows": len(rows), "pages": len(pages), tables.TTL_ATTRIBUTE: expires_at})


def get_result(day: str, page: int) -> dict | None:
    """A UTC day's kept reconciliation with the ``models`` of one of its ``pages`` (none
    past the last)."""
    key = keys.reconciliation_key(day)
    summary = table(tables.DAILY_TOTAL).get_item(Key=key).get("Item")
    if summary is None:
        return None
    found = (
        table(tables.DAILY_TOTAL).get_item(Key=keys.page_key(key, page)).get("Item")
        if page < summary["pages"]
        else None
    )
    return {**summary, "models": found["models"] if found else []}
