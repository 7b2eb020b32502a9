"""Bedrock Converse and ConverseStream calls guarded by the keeper: the recommended model,
then a usage report.

Every call that reached Bedrock is reported, because Bedrock may bill it: a successful one
with its token counts (status ``OK``), and one that failed after the request was sent
(throttled, timed out, refused, or a stream that broke or was left unfinished) with
whatever token counts are known, 0 if none (status ``ERROR``). The day's records then match
what the provider may bill. A call that never left the machine (no connection, a bad
parameter) is not reported.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError, ResponseStreamingError

from .errors import PriceKeeperError
from .models import ModelChoice, UsageReceipt, UsageRecord

log = logging.getLogger("price_keeper_client")

# Failures after the request reached Bedrock (ClientError covers the errors Bedrock answers,
# EventStreamError included: an error event inside a stream).
SENT_ERRORS = (ClientError, ReadTimeoutError, ConnectionClosedError, ResponseStreamingError)


def usage_record(
    choice: ModelChoice, usage: dict | None, calling_region: str | None, status: str = "OK"
) -> UsageRecord:
    """A record of Bedrock's ``usage`` (Converse's, or a stream's ``metadata``), under a fresh ``request_id``."""
    usage = usage or {}
    return UsageRecord(
        request_id=str(uuid.uuid4()),
        model_label=choice.label,
        bedrock_model_id=choice.bedrock_model_id,
        input_tokens=int(usage.get("inputTokens", 0)),
        output_tokens=int(usage.get("outputTokens", 0)),
        cache_read_input_tokens=int(usage.get("cacheReadInputTokens", 0)),
        cache_write_input_tokens=int(usage.get("cacheWriteInputTokens", 0)),
        timestamp=datetime.now(UTC),
        calling_region=calling_region,
        status=status,
    )


@dataclass(frozen=True)
class ConverseResult:
    """The Converse ``response`` (unchanged) with the model that served it and what was reported.

    ``receipt`` is the service's answer when the usage was reported at once; it is None when
    the record went to the background queue.
    """

    response: dict = field(repr=False)
    choice: ModelChoice
    usage: UsageRecord
    receipt: UsageReceipt | None

    @property
    def text(self) -> str:
        """The assistant's text blocks, joined."""
        content = ((self.response.get("output") or {}).get("message") or {}).get("content") or []
        return "".join(block["text"] for block in content if "text" in block)

    @property
    def stop_reason(self) -> str | None:
        return self.response.get("stopReason")


class ConverseStream:
    """A ConverseStream call: iterate it for Bedrock's events, unchanged.

    Its usage is reported once, when the stream ends: the ``metadata`` event's token counts
    with status ``OK``; when the stream breaks (the error is re-raised to the loop) or is
    closed before its end (``close()``, leaving the ``with`` block, a ``break`` followed by
    garbage collection), what it has with status ``ERROR``. ``usage`` and ``receipt`` are
    set then.
    """

    def __init__(
        self,
        response: dict,
        choice: ModelChoice,
        calling_region: str | None,
        record_usage: Callable[[UsageRecord], UsageReceipt | None],
    ):
        self.response = response
        self.choice = choice
        self.usage: UsageRecord | None = None
        self.receipt: UsageReceipt | None = None
        self._region = calling_region
        self._record_usage = record_usage
        self._events = self._relay(response["stream"])

    def __iter__(self) -> Iterator[dict]:
        return self._events

    def __enter__(self) -> ConverseStream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading; an unfinished stream is reported (``ERROR``) and its connection closed."""
        self._events.close()
        self._report({}, "ERROR", quietly=True)  # the stream was never read
        self.response["stream"].close()

    def _relay(self, stream) -> Iterator[dict]:
        usage: dict = {}
        try:
            for event in stream:
                if "metadata" in event:
                    usage = event["metadata"].get("usage") or {}
                yield event
        except BaseException:  # broken, or closed by the reader: report what is known
            self._report(usage, "ERROR", quietly=True)
            raise
        self._report(usage, "OK")

    def _report(self, usage: dict, status: str, quietly: bool = False) -> None:
        if self.usage is not None:
            return
        self.usage = usage_record(self.choice, usage, self._region, status)
        if quietly:
            self.receipt = report_quietly(self._record_usage, self.usage)
        else:
            self.receipt = self._record_usage(self.usage)


def report_quietly(
    record_usage: Callable[[UsageRecord], UsageReceipt | None], record: UsageRecord
) -> UsageReceipt | None:
    """Report while a Bedrock error is on its way to the caller: a refused report is logged,
    so the caller sees Bedrock's error, not the report's."""
    try:
        return record_usage(record)
    except PriceKeeperError as error:
        log.error("usage report of failed call %s refused: %s", record.request_id, error.code)
        return None


class GuardedBedrock:
    """Calls ``bedrock-runtime`` Converse / ConverseStream with the model the keeper
    recommends and reports their usage.

    ``select()`` gives the current :class:`ModelChoice` (raising ``QuotaExceeded`` when all
    quotas are spent); ``record_usage(record)`` reports and returns the receipt or None.
    """

    def __init__(
        self,
        bedrock_client: Any,
        select: Callable[[], ModelChoice],
        record_usage: Callable[[UsageRecord], UsageReceipt | None],
    ):
        self.client = bedrock_client
        self._select = select
        self._record_usage = record_usage

    def _call(self, operation: Callable[..., dict], messages: list[dict], kwargs: dict) -> tuple[ModelChoice, dict]:
        """The recommended model and Bedrock's response; a call that failed after it was
        sent is reported (``ERROR``, no tokens known) before its error is re-raised."""
        if "modelId" in kwargs:
            raise TypeError("the keeper picks the model itself; do not pass modelId")
        choice = self._select()
        try:
            return choice, operation(modelId=choice.bedrock_model_id, messages=messages, **kwargs)
        except SENT_ERRORS:
            report_quietly(self._record_usage, usage_record(choice, None, self.client.meta.region_name, "ERROR"))
            raise

    def converse(self, messages: list[dict], **kwargs: Any) -> ConverseResult:
        choice, response = self._call(self.client.converse, messages, kwargs)
        record = usage_record(choice, response.get("usage"), self.client.meta.region_name)
        return ConverseResult(response, choice, record, self._record_usage(record))

    def converse_stream(self, messages: list[dict], **kwargs: Any) -> ConverseStream:
        choice, response = self._call(self.client.converse_stream, messages, kwargs)
        return ConverseStream(response, choice, self.client.meta.region_name, self._record_usage)
