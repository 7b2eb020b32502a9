"""Spend report: per day x app x label totals from DailyTotal, as JSON rows or CSV.

One Query per usage key over the range (never a Scan): each app's scope (APP-scoped orgs) or
the org scope (ORG-scoped: rows have ``app_id: null``, and an app token sees the org's rows)
x the labels of its ordering; labels with spend outside the ordering, named by the scope
totals, in a second round. Days without spend have no row; days are org-local.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import date
from typing import NamedTuple

from ..errors import invalid_request
from ..store import config_items, daily_totals, keys, usage
from ..timeutil import FIRST_DAY, LAST_DAY, in_calendar, parse_day
from . import orgs

MAX_DAYS = 92
MAX_USAGE_KEYS = 200  # x 92 days of rows stays well under Lambda's 6 MB response limit
MAX_QUERIES = 500  # usage keys a report Queries: one app's 400 profiles and its ordering
COLUMNS = ("date", "app_id", "label", *usage.COUNTERS)
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_date(value: str | None, name: str, latest: date | None = None) -> date:
    """A ``YYYY-MM-DD`` query or path value in the calendar clients may name, not after ``latest``
    (an org's today); 400 otherwise."""
    if value is None:
        raise invalid_request(f"{name} is required", **{name: None, "expected_format": "YYYY-MM-DD"})
    try:
        if not _ISO_DATE.fullmatch(value):
            raise ValueError
        parsed = date.fromisoformat(value)
    except ValueError:
        raise invalid_request("Invalid date format", **{name: value[:32], "expected_format": "YYYY-MM-DD"}) from None
    if not in_calendar(parsed):
        raise invalid_request(
            "Date outside the supported range",
            **{name: value, "earliest": FIRST_DAY.isoformat(), "latest": LAST_DAY.isoformat()},
        )
    if latest is not None and parsed > latest:
        raise invalid_request("Date cannot be in the future", **{name: value, "org_today": latest.isoformat()})
    return parsed


def check_range(first: date, last: date) -> None:
    if first > last:
        raise invalid_request("from must not be after to", **{"from": first.isoformat(), "to": last.isoformat()})
    days = (last - first).days + 1
    if days > MAX_DAYS:
        raise invalid_request(
            f"The range covers {days} days; at most {MAX_DAYS} are allowed",
            **{"from": first.isoformat(), "to": last.isoformat(), "max_days": MAX_DAYS},
        )


def _check_rows(usage_keys: int, days: int) -> None:
    """400 when the report, with its labels outside the ordering, would answer more key-days than
    ``MAX_USAGE_KEYS`` x ``MAX_DAYS`` or Query more than ``MAX_QUERIES`` usage keys."""
    if usage_keys * days > MAX_USAGE_KEYS * MAX_DAYS or usage_keys > MAX_QUERIES:
        raise invalid_request(
            f"{usage_keys} apps x labels with spend over {days} days is too many for one report; "
            "narrow it with app_id or a shorter range",
            usage_keys=usage_keys,
            days=days,
            max_usage_key_days=MAX_USAGE_KEYS * MAX_DAYS,
            max_usage_keys=MAX_QUERIES,
        )


class UsageKey(NamedTuple):
    scope: orgs.EffectiveConfig
    label: str

    @property
    def usage_key(self) -> str:
        return keys.usage_key(self.scope.scope, self.label)

    def row(self, item: dict) -> dict:
        """The row of this key's total ``item`` of a day (an ORG scope's rows have no app)."""
        return {
            "date": parse_day(keys.day_of_key(item["date_key"])).isoformat(),
            "app_id": self.scope.app_id if self.scope.quota_scope == "APP" else None,
            "label": self.label,
            **{name: int(item.get(name, 0)) for name in usage.COUNTERS},
        }


def _scopes(org_id: str, app_id: str | None) -> list[orgs.EffectiveConfig]:
    """The quota scopes the report covers (``app_id`` of an ORG-scoped org's config is None)."""
    org = orgs.effective_config(org_id)
    app = orgs.effective_config(org_id, app_id) if app_id is not None else None  # 404 when not registered
    if org.quota_scope == "ORG":
        return [org]
    if app is not None:
        return [app]
    org_item, _ = config_items.org_and_app(org_id, None)
    return [
        orgs.merge(org_item, item, org_id, item["app_id"])
        for item in config_items.app_items(org_id, orgs.APP_OVERRIDABLE)
    ]


def spend_rows(org_id: str, first_day: str | None, last_day: str | None, app_id: str | None = None) -> list[dict]:
    """Rows for ``from``..``to`` (inclusive) sorted by date, app and ordering position."""
    first, last = parse_date(first_day, "from"), parse_date(last_day, "to")
    check_range(first, last)
    scopes = _scopes(org_id, app_id)
    usage_keys = [UsageKey(scope, label) for scope in scopes for label in scope.model_ordering]
    if len(usage_keys) + len(scopes) > MAX_USAGE_KEYS:
        raise invalid_request(
            "Too many apps x labels for one report; narrow it with app_id",
            usage_keys=len(usage_keys),
            max_usage_keys=MAX_USAGE_KEYS,
        )
    found = daily_totals.days_between(
        [key.usage_key for key in usage_keys] + [keys.scope_total_key(scope.scope) for scope in scopes], first, last
    )
    results, scope_totals = found[: len(usage_keys)], found[len(usage_keys) :]
    held: dict[tuple[str, str], dict[str, dict]] = {}  # (scope, date_key) -> label -> its total
    for key, items in zip(usage_keys, results, strict=True):
        for item in items:
            held.setdefault((key.scope.scope, item["date_key"]), {})[key.label] = item
    config_labels = orgs.config_labels_ever()
    apart = [
        scope.scope
        for scope, items in zip(scopes, scope_totals, strict=True)
        if any(
            daily_totals.lists_apart_beyond(item, held.get((scope.scope, item["date_key"]), {}), config_labels)
            for item in items
        )
    ]
    listed = dict(zip(apart, daily_totals.spent_labels(apart, first, last), strict=True))
    # labels with spend outside the ordering: those listed, and the config labels (never listed)
    extra_keys = [
        UsageKey(scope, label)
        for scope in scopes
        for label in sorted((listed.get(scope.scope, set()) | set(config_labels)) - set(scope.model_ordering))
    ]
    _check_rows(len(usage_keys) + len(extra_keys), (last - first).days + 1)
    if extra_keys:
        usage_keys += extra_keys
        results += daily_totals.days_between([key.usage_key for key in extra_keys], first, last)
    rows = [key.row(item) for key, items in zip(usage_keys, results, strict=True) for item in items]
    return sorted(rows, key=lambda row: row["date"])  # stable: the keys' order within a date


def to_csv(rows: list[dict]) -> str:
    """RFC 4180 CSV with a header row; ``app_id`` null is an empty field."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows({name: ("" if value is None else value) for name, value in row.items()} for row in rows)
    return out.getvalue()
