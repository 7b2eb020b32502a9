"""The hourly audit, fanned out through one SQS queue.

The queue has one producer and one worker (the aggregator, on the queue's event source
mapping):

- **The plan** (``plan_audit``, the schedule): for each org day in play, a paginated Query
  of each of the day's partition keys of the sparse ``active-by-day`` index (at once) lists
  the label-days written that day; they are enqueued in chunks of ``AUDIT_CHUNK``
  (``SendMessageBatch``, 10 messages a call).
- **The worker** (``repair``): each chunk's label-days audited
  (``aggregation.audit_label_days``), the chunks in parallel: the audit finishes in the time
  the planner pages the index plus one chunk's reads, however many scopes there are.

A message audited twice changes nothing. One that cannot be read is reported to the
mapping (``ReportBatchItemFailures``): SQS delivers it again and then moves it to the
queue's dead-letter queue, which is alarmed; the other messages of the batch are done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from ..aws import client
from ..observability import logger
from ..store import usage
from ..timeutil import utc_now
from . import aggregation
from .aggregation import LabelDay, RunReport

AUDIT_CHUNK = 100  # label-days per message: a few BatchGetItems
SEND_BATCH = 10  # messages per SendMessageBatch (SQS's maximum)
SEND_BATCH_BYTES = 256 * 1024  # SQS's maximum for the bodies of one SendMessageBatch together


def queue_url() -> str | None:
    """The repair queue (``REPAIR_QUEUE_URL``; the CDK stack and the local stack set it)."""
    return os.environ.get("REPAIR_QUEUE_URL") or None


def plan_audit(now: datetime | None = None) -> dict:
    """Enqueue every label-day written on the org days in play (``[usage_key, date_key]``),
    ``AUDIT_CHUNK`` to a message; what was sent. The heartbeat too: the aggregator ran."""
    now = now or utc_now()
    days = aggregation.days_in_play(now)
    entries = [list(label_day) for day in days for label_day in sorted(usage.active_label_days(day))]
    bodies = [
        json.dumps({"audit": entries[start : start + AUDIT_CHUNK]}) for start in range(0, len(entries), AUDIT_CHUNK)
    ]
    sqs = client("sqs")
    for batch in _send_batches(bodies):
        entries_sent = [{"Id": str(n), "MessageBody": body} for n, body in enumerate(batch)]
        failed = sqs.send_message_batch(QueueUrl=queue_url(), Entries=entries_sent).get("Failed")
        if failed:
            raise RuntimeError(f"{len(failed)} audit messages not enqueued")  # the schedule retries the plan
    aggregation.heartbeat(0, now)
    return {"days": days, "label_days": len(entries), "messages": len(bodies)}


def _send_batches(bodies: list[str]) -> list[list[str]]:
    """``bodies`` in SendMessageBatch calls of at most ``SEND_BATCH`` messages and
    ``SEND_BATCH_BYTES`` together (a chunk of hot label-days of long ids is ~45 KB)."""
    batches: list[list[str]] = []
    size = 0
    for body in bodies:
        length = len(body.encode())
        if not batches or len(batches[-1]) == SEND_BATCH or size + length > SEND_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(body)
        size += length
    return batches


class Repaired(NamedTuple):
    report: RunReport
    failed_messages: list[str]  # ids of the messages that cannot be read


def repair(messages: Mapping[str, str], now: datetime | None = None) -> Repaired:
    """The worker: audit what a batch of audit messages (id -> body) names. A message that
    cannot be read (a malformed body) is named failed on its own: it comes back alone, and
    the others are audited all the same."""
    audited: list[LabelDay] = []
    unreadable: list[str] = []
    for message_id, body in messages.items():
        try:
            audited += [(str(usage_key), str(date_key)) for usage_key, date_key in json.loads(body)["audit"]]
        except (ValueError, KeyError, TypeError):
            logger.exception("repair message not readable", extra={"message_id": message_id})
            unreadable.append(message_id)
    return Repaired(aggregation.audit_label_days(audited, now), unreadable)
