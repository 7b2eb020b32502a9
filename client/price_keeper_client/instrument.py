"""Every Bedrock call of a boto3 client metered without rewriting it: ``instrument(client)``.

Handlers on botocore's own events guard ``Converse``, ``ConverseStream``, ``InvokeModel``
and ``InvokeModelWithResponseStream``, whichever code makes the call (boto3, LangChain,
Strands, LlamaIndex, ...):

- ``before-parameter-build``: the request's ``modelId`` is mapped to one of the app's labels
  (``LabelMap``) and the mode acts: ``observe`` lets it through, ``enforce`` raises
  ``QuotaExceeded`` when the label is spent (Bedrock is not called), ``route`` replaces
  ``modelId`` with the selection's model, ``hard_cap`` reserves the call's worst case.
- ``after-call``: the usage is reported (Converse's ``usage``; InvokeModel's token-count
  headers, else the provider's body); a stream's response is wrapped so that its usage is
  reported at its end (``metadata``, ``amazon-bedrock-invocationMetrics``) or, when the
  reader stops early, once the rest is drained in the background; Bedrock's error
  answers are reported as ``ERROR``.
- ``after-call-error``: a call that failed after it was sent (timeout, broken connection)
  is ``ERROR``; one that never left releases its reservation.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.eventstream import EventStream
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
from botocore.response import StreamingBody

from .bedrock import PROMPT_OVERHEAD_TOKENS, how_called, max_input_tokens, usage_record
from .errors import InvalidModelLabel, PriceKeeperError, QuotaExceeded

log = logging.getLogger("price_keeper_client")

OPERATIONS = ("Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream")
MODES = ("observe", "enforce", "route", "hard_cap")
LABEL_MAP_SECS = 300.0  # the label map is read again after this, or on a miss at most every MISS_RETRY_SECS
MISS_RETRY_SECS = 60.0
_CONTEXT = "price_keeper"
_SENT_ERRORS = (ReadTimeoutError, ConnectionClosedError, ResponseStreamingError)
_GEOGRAPHY = re.compile(r"^(?:us|eu|apac|jp|au|ca|us-gov|global)\.(?=[a-z0-9-]+\.)")
_ARN = re.compile(r"^arn:[a-z-]+:bedrock:[a-z0-9-]*:\d{0,12}:(?P<kind>[a-z-]+)/(?P<id>.+)$")
_METRICS = b"amazon-bedrock-invocationMetrics"


def model_key(model_id: str) -> str:
    """A model id in any form Bedrock takes, as the model it names: a foundation-model or
    system-profile ARN and a geography's or ``global.`` prefix are dropped; an application
    profile stays its ARN (it names no model of its own)."""
    arn = _ARN.match(model_id)
    if arn:
        if arn["kind"] == "application-inference-profile":
            return model_id
        model_id = arn["id"]
    return _GEOGRAPHY.sub("", model_id)


class LabelMap:
    """``modelId`` -> the app's label, from the labels of its ordering (and any it spent on
    today) with their model or profile ARN (``PriceKeeper.label_models``), plus ``labels``
    given by the app (for profiles it registered and has not spent on yet). The exact id
    wins, then the model it names (``model_key``); of two labels of one model, the first of
    the ordering. Read again every ``LABEL_MAP_SECS``, and on a miss at most every
    ``MISS_RETRY_SECS``; while the service cannot be reached the last map stays."""

    def __init__(self, keeper, labels: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic):
        self.keeper = keeper
        self.given = dict(labels or {})
        self.clock = clock
        self._lock = threading.Lock()
        self._exact: dict[str, str] = {}
        self._models: dict[str, str] = {}
        self._read_at: float | None = None

    def label(self, model_id: str) -> str | None:
        found = self._find(model_id)
        now = self.clock()
        stale = self._read_at is None or now - self._read_at >= LABEL_MAP_SECS
        if stale or (found is None and now - self._read_at >= MISS_RETRY_SECS):
            self.refresh()
            found = self._find(model_id)
        return found

    def _find(self, model_id: str) -> str | None:
        if model_id in self.given:
            return self.given[model_id]
        with self._lock:
            return self._exact.get(model_id) or self._models.get(model_key(model_id))

    def refresh(self) -> None:
        with self._lock:
            self._read_at = self.clock()
        try:
            labels = self.keeper.label_models()
        except PriceKeeperError as error:
            if not self.keeper.unreachable(error) or not (self._exact or self.keeper.failing_open(error)):
                raise
            log.warning("label map not read (%s): the last one is kept", error.code)
            return
        except (TypeError, ValueError, KeyError):  # an answer this client cannot read: never the app's failure
            log.exception("label map not read: the last one is kept")
            return
        exact: dict[str, str] = {}
        models: dict[str, str] = {}
        for label, model_id in labels:
            if model_id:
                exact.setdefault(model_id, label)
                models.setdefault(model_key(model_id), label)
        for model_id, label in self.given.items():
            models.setdefault(model_key(model_id), label)
        with self._lock:
            self._exact, self._models = exact, models


@dataclass
class _Call:
    """One guarded call, from its request to its report."""

    operation: str
    label: str
    model_id: str
    region: str | None
    reservation_id: str | None = None
    how: dict = field(default_factory=dict)  # a Converse call's service tier and latency setting (``how_called``)
    reported: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Instrumentation:
    """The handlers of one instrumented client or session. ``reported``: calls reported (or
    queued); ``unmapped_calls``: calls whose ``modelId`` maps to no label (``observe`` lets
    them through unreported)."""

    def __init__(
        self,
        keeper,
        mode: str,
        labels: LabelMap,
        background: bool,
        max_output_tokens: int | None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.keeper = keeper
        self.mode = mode
        self.labels = labels
        self.background = background
        self.max_output_tokens = max_output_tokens
        self.unmapped_calls = 0
        self.reported = 0
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # -- registration ----------------------------------------------------------------------

    def handlers(self) -> list[tuple[str, Callable]]:
        found = []
        for operation in OPERATIONS:
            found.append((f"before-parameter-build.bedrock-runtime.{operation}", self.before))
            found.append((f"after-call.bedrock-runtime.{operation}", self.after))
            found.append((f"after-call-error.bedrock-runtime.{operation}", self.after_error))
        return found

    # -- before the call ---------------------------------------------------------------------

    def before(self, params: dict, model, context: dict, **_: Any) -> None:
        model_id = params.get("modelId")
        if not isinstance(model_id, str):
            return  # botocore's own validation refuses it
        label = self.labels.label(model_id)
        if label is None:
            self._unmapped(model_id)
            return
        if self.mode in ("enforce", "route") and self._spent(label):
            if self.mode == "enforce":
                raise QuotaExceeded(f"the daily quota of {label} is spent; {model_id} was not called")
            choice = self.keeper.select_model()  # QuotaExceeded when every label is spent
            log.info("routing %s (%s, spent) to %s", model_id, label, choice.bedrock_model_id)
            params["modelId"], label, model_id = choice.bedrock_model_id, choice.label, choice.bedrock_model_id
        call = _Call(model.name, label, model_id, context.get("client_region"))
        if model.name.startswith("Converse"):
            call.how = how_called(params)
        if self.mode == "hard_cap":
            call.reservation_id = self._reserve(call, params).reservation_id
        context[_CONTEXT] = call

    def _unmapped(self, model_id: str) -> None:
        with self._lock:
            self.unmapped_calls += 1
            first = model_id not in self._warned
            self._warned.add(model_id)
        if self.mode != "observe":
            raise InvalidModelLabel(f"{model_id} maps to no label of this app; it was not called")
        if first:
            log.warning("%s maps to no label of this app: its calls are not reported", model_id)

    def _spent(self, label: str) -> bool:
        """The label's quota is spent, as last heard. Asks the selection when it is due."""
        try:
            self.keeper.select_model()
        except QuotaExceeded:
            return True
        except PriceKeeperError as error:
            if not self.keeper.unreachable(error) or not self.keeper.failing_open(error):
                raise
            return False
        return self.keeper.label_status(label) == "EXCEEDED"

    def _reserve(self, call: _Call, params: dict):
        if call.operation.startswith("Converse"):
            output = (params.get("inferenceConfig") or {}).get("maxTokens")
            prompt = max_input_tokens(params.get("messages") or [], params)
        else:
            body = params.get("body") or b""
            raw = body.encode() if isinstance(body, str) else bytes(body)
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                request = {}
            output = _invoke_max_tokens(request if isinstance(request, dict) else {})
            prompt = len(raw) + PROMPT_OVERHEAD_TOKENS
        output = output or self.max_output_tokens
        if not output:
            raise ValueError("hard_cap needs the call's maxTokens (or instrument(max_output_tokens=...))")
        return self.keeper.reserve(int(prompt), int(output), model_label=call.label, calling_region=call.region)

    # -- after the call ----------------------------------------------------------------------

    def after(self, http_response, parsed: dict, model, context: dict, **_: Any) -> None:
        call = context.pop(_CONTEXT, None)
        if call is None:
            return
        if http_response.status_code >= 300:
            self.report(call, {}, "ERROR")
        elif call.operation == "Converse":
            self.report(call, parsed.get("usage") or {}, "OK")
        elif call.operation == "InvokeModel":
            self.report(call, self._invoke_usage(http_response, parsed), "OK")
        else:
            member = "stream" if call.operation == "ConverseStream" else "body"
            if isinstance(parsed.get(member), EventStream):
                parsed[member] = MeteredStream(parsed[member], _StreamMeter(self, call))
            else:
                self.report(call, {}, "ERROR")

    def after_error(self, exception: Exception, context: dict, **_: Any) -> None:
        call = context.pop(_CONTEXT, None)
        if call is None:
            return
        if isinstance(exception, _SENT_ERRORS):
            self.report(call, {}, "ERROR")
        elif call.reservation_id:
            try:
                self.keeper.release(call.reservation_id)
            except PriceKeeperError as error:  # the hold ends at its expiry anyway
                log.error("release of %s refused: %s", call.reservation_id, error.code)

    @staticmethod
    def _invoke_usage(http_response, parsed: dict) -> dict:
        """The token-count headers; without them the provider's body (read, and put back)."""
        headers = http_response.headers
        counts = headers.get("x-amzn-bedrock-input-token-count"), headers.get("x-amzn-bedrock-output-token-count")
        if all(value is not None for value in counts):
            usage = {"inputTokens": int(counts[0]), "outputTokens": int(counts[1])}
            for name in ("cache-read", "cache-write"):
                value = headers.get(f"x-amzn-bedrock-{name}-input-token-count")
                if value is not None:
                    usage["cacheReadInputTokens" if name == "cache-read" else "cacheWriteInputTokens"] = int(value)
            return usage
        body = parsed.get("body")
        if body is None:
            return {}
        data = body.read()
        parsed["body"] = StreamingBody(io.BytesIO(data), len(data))
        try:
            return body_usage(json.loads(data))
        except ValueError:
            return {}

    def report(self, call: _Call, usage: dict, status: str) -> None:
        """One record per call (a stream's end and its drain may both try), never raising
        into the app's call: a refused report is logged."""
        with call.lock:
            if call.reported:
                return
            call.reported = True
        with self._lock:
            self.reported += 1
        record = usage_record(call.label, call.model_id, usage, call.region, status, call.reservation_id, call.how)
        try:
            if self.background:
                self.keeper.submit_usage(record)
            else:
                self.keeper.record_usage(record)
        except (PriceKeeperError, RuntimeError, OverflowError) as error:
            log.error("usage report of %s refused: %s", record.request_id, getattr(error, "code", error))


def _invoke_max_tokens(request: dict) -> int | None:
    config = request.get("inferenceConfig") or request.get("textGenerationConfig") or {}
    for value in (request.get("max_tokens"), config.get("maxTokens"), config.get("maxTokenCount")):
        if isinstance(value, int):
            return value
    return None


def body_usage(body: Any) -> dict:
    """Token counts of a provider's InvokeModel body: Converse-style ``usage`` (Nova),
    Anthropic's ``input_tokens``/``output_tokens``, or ``amazon-bedrock-invocationMetrics``."""
    if not isinstance(body, dict):
        return {}
    metrics = body.get("amazon-bedrock-invocationMetrics")
    if isinstance(metrics, dict):
        return {
            "inputTokens": metrics.get("inputTokenCount", 0),
            "outputTokens": metrics.get("outputTokenCount", 0),
            "cacheReadInputTokens": metrics.get("cacheReadInputTokenCount", 0),
            "cacheWriteInputTokens": metrics.get("cacheWriteInputTokenCount", 0),
        }
    usage = body.get("usage")
    if isinstance(usage, dict):
        if "inputTokens" in usage or "outputTokens" in usage:
            return usage
        return {ours: usage.get(theirs, 0) for theirs, ours in _ANTHROPIC_COUNTS.items()}
    return {}


_ANTHROPIC_COUNTS = {
    "input_tokens": "inputTokens",
    "output_tokens": "outputTokens",
    "cache_read_input_tokens": "cacheReadInputTokens",
    "cache_creation_input_tokens": "cacheWriteInputTokens",
}


def _chunk_usage(chunk: dict) -> dict:
    """Counts in a provider's stream chunk: Nova's ``metadata``, Anthropic's ``message_start``
    (input) and ``message_delta`` (output so far)."""
    if isinstance(chunk.get("metadata"), dict):
        return body_usage(chunk["metadata"])
    if chunk.get("type") == "message_start":
        usage = (chunk.get("message") or {}).get("usage")
    elif chunk.get("type") == "message_delta":
        usage = chunk.get("usage")
    else:
        return {}
    usage = usage if isinstance(usage, dict) else {}
    return {ours: usage[theirs] for theirs, ours in _ANTHROPIC_COUNTS.items() if theirs in usage}


class _StreamMeter:
    """What a stream has shown of its usage, and its one report."""

    def __init__(self, instrumentation: Instrumentation, call: _Call):
        self.instrumentation = instrumentation
        self.call = call
        self.usage: dict = {}
        self.ended = False
        self._metrics = False

    def see(self, event: dict) -> None:
        if "metadata" in event:  # ConverseStream
            self.usage = event["metadata"].get("usage") or self.usage
        chunk = (event.get("chunk") or {}).get("bytes")
        if chunk and (_METRICS in chunk or (b'"usage"' in chunk and not self._metrics)):
            try:
                body = json.loads(chunk)
            except ValueError:
                return
            if _METRICS in chunk:  # InvokeModelWithResponseStream's last chunk: the counts Bedrock bills
                self._metrics = True
                self.usage = body_usage(body) or self.usage
            else:  # the provider's own counts, if the metrics never come
                self.usage = {**self.usage, **_chunk_usage(body)}

    def end(self, status: str) -> None:
        self.ended = True
        self.instrumentation.report(self.call, self.usage, status)

    def abandon(self, stream: EventStream) -> None:
        """The reader stopped before the end: the rest is read in the background for the
        usage Bedrock counts, then reported (``ERROR`` with what is known if that fails)."""
        if self.ended or self.call.reported:
            return
        self.ended = True
        threading.Thread(target=self._drain, args=(stream,), name="price-keeper-drain", daemon=True).start()

    def _drain(self, stream: EventStream) -> None:
        try:
            for event in stream:
                self.see(event)
        except Exception:  # broken or already closed: what was seen
            self.instrumentation.report(self.call, self.usage, "ERROR")
            return
        finally:
            stream.close()
        self.instrumentation.report(self.call, self.usage, "OK" if self.usage else "ERROR")


class MeteredStream(EventStream):
    """A Bedrock response stream (``EventStream``), unchanged for its reader, whose usage is
    reported at its end, when it breaks, or when the reader stops early (``close()``, or
    the stream garbage-collected unfinished)."""

    def __init__(self, inner: EventStream, meter: _StreamMeter):  # noqa: D107 (no super().__init__: wraps inner)
        self.__dict__.update(inner.__dict__)
        self._inner = inner
        self._meter = meter
        weakref.finalize(self, meter.abandon, inner)

    def __iter__(self):
        meter = self._meter
        try:
            for event in self._inner:
                meter.see(event)
                yield event
        except Exception:  # broken (an error event, a dropped connection); a reader's break is not one
            meter.end("ERROR")
            raise
        meter.end("OK")

    def close(self) -> None:
        self._meter.abandon(self._inner)


# -- instrument / uninstrument -----------------------------------------------------------------

_registry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _events(target) -> tuple[Any, Any]:
    """(the object the instrumentation is kept under, its event emitter)."""
    if target is None:
        import boto3

        target = boto3._get_default_session()
    if hasattr(target, "meta") and hasattr(target.meta, "events"):  # a client
        if target.meta.service_model.service_name != "bedrock-runtime":
            raise TypeError(f"instrument a bedrock-runtime client, not {target.meta.service_model.service_name}")
        return target, target.meta.events
    if hasattr(target, "events"):  # a boto3.Session (its clients copy its handlers when made)
        return target, target.events
    if hasattr(target, "get_component"):  # a botocore session
        return target, target.get_component("event_emitter")
    raise TypeError("instrument a bedrock-runtime client, a boto3.Session or None (the default session)")


def instrument(
    target=None,
    keeper=None,
    *,
    mode: str = "observe",
    labels: Mapping[str, str] | None = None,
    background: bool = True,
    max_output_tokens: int | None = None,
) -> Instrumentation:
    """Guard and report every Bedrock runtime call of ``target``: a ``bedrock-runtime``
    client, a ``boto3.Session`` (every client it makes from then on), or None (boto3's
    default session). ``keeper`` defaults to ``PriceKeeper.from_env`` reporting in the
    background (spool in ``PRICE_KEEPER_SPOOL_DIR`` when set). ``labels``: model ids or
    profile ARNs -> label, beside the ones the service lists. Instrumenting an instrumented
    target again returns its instrumentation unchanged."""
    owner, events = _events(target)
    with _registry_lock:
        if owner in _registry:
            return _registry[owner]
        if keeper is None:
            from .client import PriceKeeper

            keeper = PriceKeeper.from_env(report_in_background=background)
            atexit.register(keeper.close)  # its queue is sent (or left in the spool) at exit
        instrumentation = Instrumentation(keeper, mode, LabelMap(keeper, labels), background, max_output_tokens)
        for event, handler in instrumentation.handlers():
            events.register(event, handler, unique_id=f"price-keeper:{event}")
        _registry[owner] = instrumentation
        return instrumentation


def uninstrument(target=None) -> bool:
    """Removes the handlers (a session's clients made meanwhile keep theirs). False if
    ``target`` was not instrumented."""
    owner, events = _events(target)
    with _registry_lock:
        instrumentation = _registry.pop(owner, None)
        if instrumentation is None:
            return False
        for event, handler in instrumentation.handlers():
            events.unregister(event, handler, unique_id=f"price-keeper:{event}")
        return True
