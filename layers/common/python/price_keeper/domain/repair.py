"""The hourly audit, fanned out through one SQS queue.

The plan (``plan_audit``, scheduled) lists the label-days of the org days in play from the
``active-by-day`` index and enqueues them ``AUDIT_CHUNK`` to a message, plus each settled org
day to re-derive; the worker (``repair``, the aggregator) audits each chunk and re-derives
each org day. A message handled twice changes nothing; one that fails comes back alone and
ends in the alarmed dead-letter queue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from ..aws import repair_queue
from ..observability import logger
from ..store import usage
from ..timeutil import utc_now
from . import aggregation, rederive
from .aggregation import LabelDay, RunReport

AUDIT_CHUNK = 100  # label-days per message: a few BatchGetItems


def plan_audit(now: datetime | None = None) -> dict:
    """Enqueue the label-days of the org days in play, ``AUDIT_CHUNK`` to a message, and each org
    day due to be re-derived; write the heartbeat. What was sent."""
    now = now or utc_now()
    days, audited, settled = _in_play(now)
    bodies = [
        json.dumps({"audit": audited[start : start + AUDIT_CHUNK]}) for start in range(0, len(audited), AUDIT_CHUNK)
    ] + [json.dumps({"rederive": org_day}) for org_day in settled]
    repair_queue.send(bodies)  # a failure raises: the schedule retries the plan
    aggregation.heartbeat(0, now)
    return {"days": days, "label_days": len(audited), "org_days_rederived": len(settled), "messages": len(bodies)}


def _in_play(now: datetime) -> tuple[list[str], list[LabelDay], list[tuple[str, str]]]:
    """The org days in play, the label-days the ``active-by-day`` index lists on them, and the org days due to be
    re-derived (the index read once for both)."""
    days = aggregation.days_in_play(now)
    listed = {day: usage.active_label_days(day) for day in sorted({*days, *rederive.candidate_days(now)})}
    audited = [label_day for day in days for label_day in sorted(listed[day])]
    return days, audited, rederive.due_org_days([label_day for found in listed.values() for label_day in found], now)


class Repaired(NamedTuple):
    report: RunReport
    failed_messages: list[str]  # ids of the messages that cannot be read or whose org day failed


def repair(messages: Mapping[str, str], now: datetime | None = None) -> Repaired:
    """The worker: audit the label-days and re-derive the org days a batch of messages (id -> body)
    names; a message unreadable or whose org day failed is named failed on its own."""
    now = now or utc_now()
    audited: list[LabelDay] = []
    org_days: dict[str, tuple[str, str]] = {}
    failed: list[str] = []
    for message_id, body in messages.items():
        try:
            message = json.loads(body)
            if "rederive" in message:
                org_id, day = message["rederive"]
                org_days[message_id] = (str(org_id), str(day))
            else:
                audited += [(str(usage_key), str(date_key)) for usage_key, date_key in message["audit"]]
        except (ValueError, KeyError, TypeError):
            logger.exception("repair message not readable", extra={"message_id": message_id})
            failed.append(message_id)
    report = aggregation.audit_label_days(audited, now)
    for message_id, (org_id, day) in org_days.items():
        try:
            report.merge(rederive.rederive(org_id, day, now))
        except Exception:  # noqa: BLE001 - its message comes back alone; the others are done
            logger.exception("re-derivation failed", extra={"org": org_id, "day": day})
            failed.append(message_id)
    return Repaired(report, failed)


def run(now: datetime | None = None) -> RunReport:
    """The whole audit in one process (tests and tools; deployed, ``plan_audit`` fans it out)."""
    now = now or utc_now()
    days, audited, settled = _in_play(now)
    report = aggregation.audit_label_days(audited, now)
    for org_id, day in settled:
        report.merge(rederive.rederive(org_id, day, now))
    report.days = days
    aggregation.heartbeat(report.lag_seconds, now)
    return report
