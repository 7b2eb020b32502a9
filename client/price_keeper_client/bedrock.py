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
from .models import ModelChoice, Reservation, UsageReceipt, UsageRecord

log = logging.getLogger("price_keeper_client")

# Failures after the request reached Bedrock (ClientError covers the errors Bedrock answers,
# EventStreamError included: an error event inside a stream).
SENT_ERRORS = (ClientError, ReadTimeoutError, ConnectionClosedError, ResponseStreamingError)


# The hard cap's bound of a prompt's size (``max_input_tokens``), without a tokenizer.
TOKENS_PER_MESSAGE = 16  # role markers and the chat template's separators
PROMPT_OVERHEAD_TOKENS = 256  # the template's own text and tool-use scaffolding
PROMPT_FIELDS = ("system", "toolConfig")


def _bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, dict):
        return sum(_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_bytes(item) for item in value)
    return len(str(value))


def max_input_tokens(messages: list[dict], kwargs: dict) -> int:
    """An upper bound of a Converse request's input tokens: one token per byte of every value
    in ``messages``, ``system`` and ``toolConfig`` (a token of a subword tokenizer covers at
    least one byte of text), plus ``TOKENS_PER_MESSAGE`` a message and ``PROMPT_OVERHEAD_TOKENS``.
    Image and document bytes count their length, far above what Bedrock bills for them:
    pass ``max_input_tokens=`` to ``converse`` for a tighter bound of such prompts."""
    content = _bytes(messages) + sum(_bytes(kwargs.get(name)) for name in PROMPT_FIELDS if name in kwargs)
    return content + TOKENS_PER_MESSAGE * len(messages) + PROMPT_OVERHEAD_TOKENS


def how_called(request: dict, answer: dict | None = None) -> dict:
    """The record fields of how a Converse call was made: its service tier and whether it was
    latency-optimized, as Bedrock's answer (a response, a stream's ``metadata``) says, else as
    the request asked."""
    answer = answer or {}
    tier = (answer.get("serviceTier") or request.get("serviceTier") or {}).get("type") or "default"
    latency = (answer.get("performanceConfig") or request.get("performanceConfig") or {}).get("latency")
    return {"service_tier": tier, "latency_optimized": latency == "optimized"}


def one_hour_writes(usage: dict) -> int:
    """The cache writes made with the 1-hour TTL (``usage.cacheDetails``)."""
    return sum(
        int(detail.get("inputTokens", 0)) for detail in usage.get("cacheDetails") or [] if detail.get("ttl") == "1h"
    )


def usage_record(
    label: str,
    bedrock_model_id: str,
    usage: dict | None,
    calling_region: str | None,
    status: str = "OK",
    reservation_id: str | None = None,
    how: dict | None = None,
) -> UsageRecord:
    """A record of Bedrock's ``usage`` (Converse's, or a stream's ``metadata``), under a fresh
    ``request_id``; with ``reservation_id`` it settles that reservation; ``how``: the call's
    service tier and latency setting (``how_called``)."""
    usage = usage or {}
    return UsageRecord(
        request_id=str(uuid.uuid4()),
        model_label=label,
        bedrock_model_id=bedrock_model_id,
        input_tokens=int(usage.get("inputTokens", 0)),
        output_tokens=int(usage.get("outputTokens", 0)),
        cache_read_input_tokens=int(usage.get("cacheReadInputTokens", 0)),
        cache_write_input_tokens=int(usage.get("cacheWriteInputTokens", 0)),
        cache_write_1h_input_tokens=one_hour_writes(usage),
        timestamp=datetime.now(UTC),
        calling_region=calling_region,
        status=status,
        reservation_id=reservation_id,
        **(how or {}),
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
        reservation_id: str | None = None,
        request: dict | None = None,
    ):
        self.response = response
        self.reservation_id = reservation_id
        self._request = request or {}
        self._answered: dict = {}  # the metadata event's serviceTier / performanceConfig
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
                    self._answered = event["metadata"]
                yield event
        except BaseException:  # broken, or closed by the reader: report what is known
            self._report(usage, "ERROR", quietly=True)
            raise
        self._report(usage, "OK")

    def _report(self, usage: dict, status: str, quietly: bool = False) -> None:
        if self.usage is not None:
            return
        how = how_called(self._request, self._answered)
        self.usage = usage_record(
            self.choice.label, self.choice.bedrock_model_id, usage, self._region, status, self.reservation_id, how
        )
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

    Hard cap (``reserve`` given): each call first reserves its worst case,
    ``reserve(max_input_tokens, max_output_tokens, calling_region=...)`` (priced in the Bedrock
    client's Region; ``QuotaExceeded`` when no label can hold it), calls the reserved label,
    and its usage record settles the reservation (a call that failed after it was sent
    settles what it used); a call that never left the machine is released
    (``release(reservation_id)``).
    """

    def __init__(
        self,
        bedrock_client: Any,
        select: Callable[[], ModelChoice],
        record_usage: Callable[[UsageRecord], UsageReceipt | None],
        reserve: Callable[..., Reservation] | None = None,
        release: Callable[[str], None] | None = None,
    ):
        self.client = bedrock_client
        self._select = select
        self._record_usage = record_usage
        self._reserve = reserve
        self._release = release

    def _hold(self, messages: list[dict], kwargs: dict) -> Reservation:
        """Reserve the call's worst case: ``inferenceConfig.maxTokens`` (required: without it
        the output has no bound) and ``max_input_tokens`` (a caller's bound, else ours), at the
        call's service tier and latency setting."""
        max_output = (kwargs.get("inferenceConfig") or {}).get("maxTokens")
        if not max_output:
            raise ValueError("hard_cap needs inferenceConfig.maxTokens: the reservation holds its worst case")
        bound = kwargs.pop("max_input_tokens", None) or max_input_tokens(messages, kwargs)
        how = {name: value for name, value in how_called(kwargs).items() if value not in ("default", False)}
        return self._reserve(int(bound), int(max_output), calling_region=self.client.meta.region_name, **how)

    def _call(
        self, operation: Callable[..., dict], messages: list[dict], kwargs: dict
    ) -> tuple[ModelChoice, str | None, dict]:
        """The model to call, its reservation id (hard cap) and Bedrock's response; a call
        that failed after it was sent is reported (``ERROR``, no tokens known) before its
        error is re-raised, one that was never sent releases its reservation."""
        if "modelId" in kwargs:
            raise TypeError("the keeper picks the model itself; do not pass modelId")
        held = self._hold(messages, kwargs) if self._reserve else None
        choice, reservation_id = (held.as_choice(), held.reservation_id) if held else (self._select(), None)
        region = self.client.meta.region_name
        try:
            return choice, reservation_id, operation(modelId=choice.bedrock_model_id, messages=messages, **kwargs)
        except SENT_ERRORS:
            failed = usage_record(
                choice.label, choice.bedrock_model_id, None, region, "ERROR", reservation_id, how_called(kwargs)
            )
            report_quietly(self._record_usage, failed)
            raise
        except BaseException:
            if reservation_id and self._release:
                try:
                    self._release(reservation_id)
                except PriceKeeperError as error:  # the hold ends at its expiry anyway
                    log.error("release of %s refused: %s", reservation_id, error.code)
            raise

    def converse(self, messages: list[dict], **kwargs: Any) -> ConverseResult:
        choice, reservation_id, response = self._call(self.client.converse, messages, kwargs)
        how = how_called(kwargs, response)
        record = usage_record(
            choice.label,
            choice.bedrock_model_id,
            response.get("usage"),
            self.client.meta.region_name,
            "OK",
            reservation_id,
            how,
        )
        return ConverseResult(response, choice, record, self._record_usage(record))

    def converse_stream(self, messages: list[dict], **kwargs: Any) -> ConverseStream:
        choice, reservation_id, response = self._call(self.client.converse_stream, messages, kwargs)
        region = self.client.meta.region_name
        return ConverseStream(response, choice, region, self._record_usage, reservation_id, kwargs)
