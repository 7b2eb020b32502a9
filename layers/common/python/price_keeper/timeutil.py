"""Time helpers: UTC formatting and org-local days (``yyyymmdd`` in the org's timezone)."""

from __future__ import annotations

import random
import time as clock
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, available_timezones

# The calendar a date from a client may name. Python's stops at years 1 and 9999, where a
# day's neighbour or a timezone shift overflows, and glibc writes years before 1000 without
# their leading zeros (``%Y%m%d`` of 0999-12-31 is ``9991231``): no data is older than the
# first day, and the last leaves a day and any UTC offset of room before the end.
FIRST_DAY = date(1970, 1, 1)
LAST_DAY = date(9998, 12, 31)


def in_calendar(day: date) -> bool:
    """Whether ``day`` is in the calendar clients may name (``FIRST_DAY``..``LAST_DAY``)."""
    return FIRST_DAY <= day <= LAST_DAY


def retry_pause(attempt: int) -> None:
    """Sleep before retrying a conflicting write: capped exponential backoff with jitter."""
    clock.sleep(min(0.5, 0.02 * 2**attempt) * random.uniform(0.5, 1.0))


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso_utc(moment: datetime) -> str:
    """``2026-01-23T15:30:45Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_valid_timezone(name: str) -> bool:
    return isinstance(name, str) and name in _timezones()


_TZ_NAMES: frozenset[str] | None = None


def _timezones() -> frozenset[str]:
    global _TZ_NAMES
    if _TZ_NAMES is None:
        _TZ_NAMES = frozenset(available_timezones())
    return _TZ_NAMES


def org_date(tz_name: str, moment: datetime | None = None) -> date:
    """The calendar date in the org's timezone at ``moment`` (default: now)."""
    return (moment or utc_now()).astimezone(ZoneInfo(tz_name)).date()


def org_day(tz_name: str, moment: datetime | None = None) -> str:
    """``yyyymmdd`` of the org-local day containing ``moment``."""
    return org_date(tz_name, moment).strftime("%Y%m%d")


def day_start_utc(tz_name: str, day: date) -> datetime:
    """UTC instant of local midnight starting ``day`` (DST-safe: days may be 23 or 25 h)."""
    return datetime.combine(day, time(0), tzinfo=ZoneInfo(tz_name)).astimezone(UTC)


def next_midnight_utc(tz_name: str, moment: datetime | None = None) -> datetime:
    """UTC instant of the next org-local midnight after ``moment``."""
    return day_start_utc(tz_name, org_date(tz_name, moment) + timedelta(days=1))


def parse_day(day: str) -> date:
    """``yyyymmdd`` -> date."""
    return datetime.strptime(day, "%Y%m%d").date()


def org_days_in_play(moment: datetime | None = None) -> list[date]:
    """Every org-local day that can still receive usage at ``moment``, in any timezone.

    Local time is UTC-12..UTC+14, so the current org day is UTC yesterday, today or
    tomorrow; usage is accepted back to the start of the previous org day, which reaches
    UTC today - 2. Aggregation and pricing cover exactly these days.
    """
    today = (moment or utc_now()).astimezone(UTC).date()
    return [today + timedelta(days=offset) for offset in (-2, -1, 0, 1)]
