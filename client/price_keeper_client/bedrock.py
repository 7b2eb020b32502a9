"""A Bedrock Converse call guarded by the keeper: the recommended model, then a usage report."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from .models import ModelChoice, UsageReceipt, UsageRecord


def usage_record(choice: ModelChoice, response: dict, calling_region: str | None) -> UsageRecord:
    """The usage of a Converse response, under a fresh ``request_id``."""
    usage = response.get("usage") or {}
    return UsageRecord(
        request_id=str(uuid.uuid4()), model_label=choice.label, bedrock_model_id=choice.bedrock_model_id,
        input_tokens=int(usage.get("inputTokens", 0)), output_tokens=int(usage.get("outputTokens", 0)),
        cache_read_input_tokens=int(usage.get("cacheReadInputTokens", 0)),
        cache_write_input_tokens=int(usage.get("cacheWriteInputTokens", 0)),
        timestamp=datetime.now(timezone.utc), calling_region=calling_region,
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


class GuardedBedrock:
    """Calls ``bedrock-runtime`` Converse with the model the keeper recommends and reports its usage.

    ``select()`` gives the current :class:`ModelChoice` (raising ``QuotaExceeded`` when all
    quotas are spent); ``record_usage(record)`` reports and returns the receipt or None.
    """

    def __init__(self, bedrock_client: Any, select: Callable[[], ModelChoice],
                 record_usage: Callable[[UsageRecord], UsageReceipt | None]):
        self.client = bedrock_client
        self._select = select
        self._record_usage = record_usage

    def converse(self, messages: list[dict], **kwargs: Any) -> ConverseResult:
        if "modelId" in kwargs:
            raise TypeError("converse() picks the model itself; do not pass modelId")
        choice = self._select()
        response = self.client.converse(modelId=choice.bedrock_model_id, messages=messages, **kwargs)
        record = usage_record(choice, response, self.client.meta.region_name)
        return ConverseResult(response, choice, record, self._record_usage(record))
