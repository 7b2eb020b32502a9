"""SQS: the repair queue the hourly audit fans out through (``domain.repair``)."""

from __future__ import annotations

import os

from . import client

SEND_BATCH = 10  # messages per SendMessageBatch (SQS's maximum)
SEND_BATCH_BYTES = 256 * 1024  # SQS's maximum for the bodies of one SendMessageBatch together


def queue_url() -> str | None:
    """The repair queue (``REPAIR_QUEUE_URL``; the CDK stack and the local stack set it)."""
    return os.environ.get("REPAIR_QUEUE_URL") or None


def send(bodies: list[str]) -> None:
    """Every body sent, in as few SendMessageBatch calls as SQS allows; RuntimeError if any is not."""
    sqs = client("sqs")
    for batch in _send_batches(bodies):
        entries = [{"Id": str(n), "MessageBody": body} for n, body in enumerate(batch)]
        failed = sqs.send_message_batch(QueueUrl=queue_url(), Entries=entries).get("Failed")
        if failed:
            raise RuntimeError(f"{len(failed)} audit messages not enqueued")


def _send_batches(bodies: list[str]) -> list[list[str]]:
    """``bodies`` in SendMessageBatch calls of at most ``SEND_BATCH`` messages and ``SEND_BATCH_BYTES``."""
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
