"""The bill (optional; daily): a UTC day's metered spend per application inference profile against Cost Explorer's
cost for that profile's cost-allocation tag.

With config.yaml ``reconciliation.bill_tag_key`` set (a tag whose value is the profile's id), the daily run compares
``GetCostAndUsage`` grouped by that tag with each profile's metered usage of the day ``BILL_DELAY_DAYS`` back.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from ..aws import cost_explorer, stack_region
from ..config import get_config
from ..observability import logger
from ..store import reconciliation as store
from ..timeutil import iso_utc, utc_now
from . import pricing
from .aggregation import usage_expires_at
from .reconciliation import metered_counts, price_of_model

BILL_DELAY_DAYS = 3  # cost-allocation tags take 24-48 h to reach billing


def compare(day: date, now: datetime | None = None) -> dict | None:
    """Metered vs billed per tagged profile for UTC ``day``, stored; None without ``bill_tag_key``."""
    tag_key = get_config().reconciliation.bill_tag_key
    if not tag_key:
        return None
    now = now or utc_now()
    billed = cost_explorer.billed_by_tag(tag_key, day)
    start = datetime.combine(day, time(0), UTC)
    tolerance = timedelta(seconds=get_config().reconciliation.tolerance_seconds)
    metered, labels = metered_counts(day, start, min(now, start + timedelta(days=1) + tolerance))
    region = stack_region()
    profiles = []
    for profile_id in sorted(value for value in billed if value != cost_explorer.UNTAGGED):
        counts, label = metered.get(profile_id), labels.get(profile_id)
        metered_cost = (
            pricing.cost_usd_micros(counts.tokens(), price_of_model(profile_id, label, day, region).prices)
            if counts
            else 0
        )
        profiles.append(
            {
                "profile_id": profile_id,
                "billed_usd_micros": billed[profile_id],
                "metered_usd_micros": metered_cost,
                "unmetered_usd_micros": max(0, billed[profile_id] - metered_cost),
            }
        )
    result = {"date": day.isoformat(), "tag_key": tag_key, "profiles": profiles, "compared_at": iso_utc(now)}
    store.put_bill(day.strftime("%Y%m%d"), result, usage_expires_at(day.strftime("%Y%m%d")))
    gaps = [row for row in profiles if row["unmetered_usd_micros"]]
    if gaps:
        logger.warning("Billed spend beyond the metered", extra={"date": result["date"], "profiles": gaps})
    return result


def run(now: datetime | None = None) -> dict | None:
    """The daily run: the day ``BILL_DELAY_DAYS`` back, once its tags have reached billing."""
    now = now or utc_now()
    return compare(now.date() - timedelta(days=BILL_DELAY_DAYS), now)
