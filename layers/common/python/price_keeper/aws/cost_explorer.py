"""Cost Explorer: a UTC day's billed cost per value of a cost-allocation tag."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from . import client

UNTAGGED = ""  # Cost Explorer's group of the cost without the tag


def billed_by_tag(tag_key: str, day: date) -> dict[str, int]:
    """Cost Explorer's unblended cost of ``day`` per value of ``tag_key``, in micro-USD."""
    billed: dict[str, int] = {}
    request = {
        "TimePeriod": {"Start": day.isoformat(), "End": (day + timedelta(days=1)).isoformat()},
        "Granularity": "DAILY",
        "Metrics": ["UnblendedCost"],
        "GroupBy": [{"Type": "TAG", "Key": tag_key}],
    }
    while True:
        page = client("ce").get_cost_and_usage(**request)
        for result in page["ResultsByTime"]:
            for group in result.get("Groups", []):
                value = group["Keys"][0].partition("$")[2]  # "<key>$<value>"; "<key>$" is untagged
                amount = Decimal(group["Metrics"]["UnblendedCost"]["Amount"]) * 1_000_000
                billed[value] = billed.get(value, 0) + int(amount.to_integral_value())
        if not page.get("NextPageToken"):
            return billed
        request["NextPageToken"] = page["NextPageToken"]
