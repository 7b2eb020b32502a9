"""Amazon Bedrock's inference-profile calls for the local stack (moto has none).

The local server answers every request signed for the ``bedrock`` service with this
stand-in, and the local stack points ``AWS_ENDPOINT_URL_BEDROCK`` at the server, so the
shipped layer calls Bedrock exactly as in AWS. It plays Bedrock as account ``123456789012``
(moto's default) sees it:

- ``GetInferenceProfile`` of a system-defined (cross-Region) profile, by id or ARN:
  ``<geography>.<model id>`` for the geographies of ``GEOGRAPHIES`` and ``global``, asked
  from a source Region of that geography. ``models`` lists the model in each destination
  Region; a global profile lists the Region-less model ARN and the source Region, as AWS
  answers. Any model id resolves: the stand-in has no model catalogue.
- ``CreateInferenceProfile``: application profiles copying a system profile or a
  foundation model of the same Region; ``GetInferenceProfile`` resolves them by id or ARN.
  They are kept in a JSON file when one is given (``.local/`` on ``make run``).
- Another account's ARN is ``AccessDeniedException``, which is what IAM answers the
  deployed functions (their ``GetInferenceProfile`` grant names their own account only).

Any other Bedrock operation is ``UnknownOperationException``.

``Runtime`` is the ``bedrock-runtime`` side (the same signing name, ``bedrock``, told apart
by its ``/model/{modelId}/...`` paths): ``Converse``, ``ConverseStream``, ``InvokeModel``
and ``InvokeModelWithResponseStream`` (Anthropic's or Nova's body, the token-count headers,
the stream's ``amazon-bedrock-invocationMetrics``) answer a canned reply whose token counts
come from the request (about 4 characters of text per input token; ``maxTokens``, default
``DEFAULT_OUTPUT_TOKENS``, output tokens; the content before a ``cachePoint`` is written to
the cache the first time and read from it after), and each call records the ``AWS/Bedrock``
metrics AWS publishes (``Invocations``, ``InputTokenCount``, ``OutputTokenCount``,
``CacheReadInputTokenCount``, ``CacheWriteInputTokenCount``, by ``ModelId`` as the caller
named it) in the local CloudWatch (moto), which the reconciler reads.

It answers whoever reaches the port, unauthenticated, so what a call can make it keep or
record is bounded:

- Regions: a request signed for a Region botocore's partition data does not list is 403
  ``InvalidSignatureException``, as AWS answers a credential scoped to a Region the endpoint
  does not serve. Only the listed Regions (``REGIONS``) reach a per-Region client or moto
  backend.
- Requests: a body of the wrong shape (``messages`` not a non-empty list of objects,
  ``system`` or a message's ``content`` neither text nor a list of content blocks,
  ``inferenceConfig`` not an object, a block's ``text`` not a string) is Bedrock's 400
  ``ValidationException``, as is a ``maxTokens`` outside 1 to ``MAX_OUTPUT_TOKENS``. So no
  metric records more than a model's output limit.
- Prompt cache: the SHA-256 digests of the last ``PROMPT_CACHE_ENTRIES`` (model, prefix)
  pairs used, never the text. The least recently used one is forgotten first, and is then
  written again on its next use, as after Bedrock's own cache expiry.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import secrets
import string
import threading
import zlib
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import boto3
import botocore.session

ACCOUNT = "123456789012"

# Destination Regions of each geography's profiles (a model's real list may be shorter).
GEOGRAPHIES = {
    "us": ("us-east-1", "us-east-2", "us-west-2"),
    "eu": (
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
    ),
    "apac": (
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-4",
    ),
    "jp": ("ap-northeast-1", "ap-northeast-3"),
    "au": ("ap-southeast-2", "ap-southeast-4"),
    "ca": ("ca-central-1", "ca-west-1"),
    "us-gov": ("us-gov-east-1", "us-gov-west-1"),
}
GLOBAL = "global"
SYSTEM_PROFILES_CREATED = "2024-09-30T00:00:00Z"

_PREFIXES = "|".join(sorted((*GEOGRAPHIES, GLOBAL), key=len, reverse=True))
_SYSTEM_ID = re.compile(rf"^(?P<geography>{_PREFIXES})\.(?P<model>[a-z0-9-]+\.[A-Za-z0-9.:-]+)$")
_MODEL_ID = re.compile(r"^[a-z0-9-]+\.[A-Za-z0-9.:-]+$")
_ARN = re.compile(
    r"^arn:[a-z-]+:bedrock:(?P<region>[a-z0-9-]*):(?P<account>\d{12})?:"
    r"(?P<kind>inference-profile|application-inference-profile|foundation-model)/(?P<id>.+)$"
)
_NAME = re.compile(r"^([0-9a-zA-Z][ _-]?){1,64}$")
_SIGNED_FOR = re.compile(r"Credential=[^/\s]+/\d{8}/(?P<region>[a-z0-9-]+)/(?P<service>[a-z0-9-]+)/aws4_request")
_ID_ALPHABET = string.ascii_lowercase + string.digits
# Region -> partition of every Region botocore's partition data lists (aws, aws-cn,
# aws-us-gov, ...): the Regions served. Not the partitions' name patterns, which any
# made-up ``us-xyz-1`` matches.
REGIONS = {
    region: partition["partition"]
    for partition in botocore.session.get_session().get_data("endpoints")["partitions"]
    for region in partition["regions"]
}


class BedrockError(Exception):
    """An error answer: Bedrock's error code (``x-amzn-ErrorType``), HTTP status and message."""

    def __init__(self, code: str, status: int, message: str):
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


def _not_found(identifier: str) -> BedrockError:
    return BedrockError("ResourceNotFoundException", 404, f"Inference profile {identifier} not found")


def _access_denied(action: str, resource: str) -> BedrockError:
    return BedrockError(
        "AccessDeniedException",
        403,
        f"User: arn:aws:iam::{ACCOUNT}:user/local is not authorized "
        f"to perform: bedrock:{action} on resource: {resource}",
    )


def _invalid(message: str) -> BedrockError:
    return BedrockError("ValidationException", 400, message)


def _partition(region: str) -> str:
    try:
        return REGIONS[region]
    except KeyError:
        raise _invalid(f"Unknown Region {region[:64]!r}") from None


def _check_served(region: str) -> None:
    """Refuse a request signed for a Region no partition lists. The stand-in serves every
    Region at one endpoint, so the credential scope is all that names the Region. AWS
    answers a scope naming a Region its endpoint does not serve with 403
    ``InvalidSignatureException``: the Region is refused before any operation runs."""
    if region not in REGIONS:
        raise BedrockError(
            "InvalidSignatureException", 403, f"Credential should be scoped to a valid region, not '{region[:64]}'."
        )


def signed_for(headers) -> tuple[str, str] | None:
    """(service, Region) of a request's SigV4 credential scope; None for a request not signed
    for AWS (the API's own, with a bearer token or an API key)."""
    signed = _SIGNED_FOR.search(headers.get("Authorization") or "")
    return (signed["service"], signed["region"]) if signed else None


class InferenceProfiles:
    """The inference profiles the local account sees; application profiles are kept in
    ``state_file`` when given."""

    def __init__(self, state_file: Path | None = None):
        self.state_file = state_file
        self._lock = threading.Lock()
        self._applications: dict[str, dict] = {}  # ARN -> GetInferenceProfile answer + clientRequestToken
        if state_file and state_file.exists():
            self._applications = json.loads(state_file.read_text())

    def respond(self, method: str, path: str, region: str, body: bytes | None) -> dict:
        """A proxy-style response (``statusCode``, ``headers``, ``body``) in Bedrock's REST-JSON."""
        try:
            _check_served(region)
            if method == "GET" and path.startswith("/inference-profiles/"):
                status, answer = 200, self.get(unquote(path.removeprefix("/inference-profiles/")), region)
            elif method == "POST" and path == "/inference-profiles":
                status, answer = 201, self.create(region, _json(body))
            else:
                raise BedrockError(
                    "UnknownOperationException",
                    400,
                    "The local Bedrock stand-in serves GetInferenceProfile and CreateInferenceProfile only",
                )
            headers = {"Content-Type": "application/json"}
        except BedrockError as error:
            status, answer = error.status, {"message": error.message}
            headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error.code}
        return {"statusCode": status, "headers": headers, "body": json.dumps(answer)}

    def get(self, identifier: str, region: str) -> dict:
        """GetInferenceProfile of ``identifier`` (id or ARN) asked in ``region``."""
        arn = _ARN.match(identifier)
        if arn:
            if arn["kind"] == "foundation-model":
                raise _invalid(f"{identifier} is not an inference profile")
            if arn["account"] != ACCOUNT:
                raise _access_denied("GetInferenceProfile", identifier)
            region, profile_id = arn["region"], arn["id"]
        else:
            profile_id = identifier
        application = self._applications.get(self._application_arn(region, profile_id))
        if application:
            return {key: value for key, value in application.items() if key != "clientRequestToken"}
        if arn and arn["kind"] == "application-inference-profile":
            raise _not_found(identifier)
        return self._system_profile(profile_id, region)

    def create(self, region: str, request: dict) -> dict:
        """CreateInferenceProfile in ``region``: an application profile copying
        ``modelSource.copyFrom`` (a system profile or a foundation model of that Region)."""
        name, token = request.get("inferenceProfileName"), request.get("clientRequestToken")
        source = (request.get("modelSource") or {}).get("copyFrom")
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(source, str):
            raise _invalid("inferenceProfileName and modelSource.copyFrom are required")
        with self._lock:
            regional = [profile for arn, profile in self._applications.items() if _ARN.match(arn)["region"] == region]
            for profile in regional:
                if token and profile.get("clientRequestToken") == token:  # a retried request
                    return {"inferenceProfileArn": profile["inferenceProfileArn"], "status": "ACTIVE"}
            if any(profile["inferenceProfileName"] == name for profile in regional):
                raise BedrockError("ConflictException", 409, f"Inference profile {name} already exists")
            arn = self._application_arn(region, "".join(secrets.choice(_ID_ALPHABET) for _ in range(12)))
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            profile = {
                "inferenceProfileName": name,
                "createdAt": now,
                "updatedAt": now,
                "inferenceProfileArn": arn,
                "models": self._copied_models(source, region),
                "inferenceProfileId": arn.rsplit("/", 1)[1],
                "status": "ACTIVE",
                "type": "APPLICATION",
            }
            for key, value in (("description", request.get("description")), ("clientRequestToken", token)):
                if value is not None:
                    profile[key] = value
            self._applications[arn] = profile
            self._save()
        return {"inferenceProfileArn": arn, "status": "ACTIVE"}

    def _copied_models(self, source: str, region: str) -> list[dict]:
        arn = _ARN.match(source)
        if not arn or arn["kind"] == "application-inference-profile":
            raise _invalid("modelSource.copyFrom must be a foundation model or system-defined inference profile ARN")
        if arn["account"] not in (None, ACCOUNT):
            raise _access_denied("CreateInferenceProfile", source)
        if arn["region"] != region:
            raise _invalid(f"modelSource.copyFrom must be in {region}")
        if arn["kind"] == "inference-profile":
            return self._system_profile(arn["id"], region)["models"]
        if not _MODEL_ID.match(arn["id"]):
            raise _invalid(f"Invalid foundation model {arn['id']}")
        return [{"modelArn": source}]

    @staticmethod
    def _system_profile(profile_id: str, region: str) -> dict:
        system = _SYSTEM_ID.match(profile_id)
        geography = system and system["geography"]
        if geography == GLOBAL:
            serves = _partition(region) == "aws"
            destinations, where = ("", region), "all commercial AWS Regions"
        else:
            destinations = GEOGRAPHIES.get(geography, ())
            serves, where = region in destinations, ", ".join(destinations)
        if not serves:
            raise _not_found(profile_id)
        model, partition = system["model"], _partition(region)
        return {
            "inferenceProfileName": f"{geography.upper()} {model}",
            "description": f"Routes requests to {model} in {where}.",
            "createdAt": SYSTEM_PROFILES_CREATED,
            "updatedAt": SYSTEM_PROFILES_CREATED,
            "inferenceProfileArn": f"arn:{partition}:bedrock:{region}:{ACCOUNT}:inference-profile/{profile_id}",
            "models": [
                {"modelArn": f"arn:{partition}:bedrock:{destination}::foundation-model/{model}"}
                for destination in destinations
            ],
            "inferenceProfileId": profile_id,
            "status": "ACTIVE",
            "type": "SYSTEM_DEFINED",
        }

    @staticmethod
    def _application_arn(region: str, profile_id: str) -> str:
        return f"arn:{_partition(region)}:bedrock:{region}:{ACCOUNT}:application-inference-profile/{profile_id}"

    def _save(self) -> None:
        if self.state_file:
            temporary = self.state_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(self._applications, indent=1))
            os.replace(temporary, self.state_file)


def _json(body: bytes | None) -> dict:
    try:
        request = json.loads(body or b"{}")
    except (ValueError, RecursionError):  # RecursionError: arrays or objects nested past Python's limit
        raise _invalid("The request body is not JSON") from None
    if not isinstance(request, dict):
        raise _invalid("The request body must be a JSON object")
    return request


# --- bedrock-runtime ---------------------------------------------------------------

DEFAULT_OUTPUT_TOKENS = 100
# The largest ``maxTokens`` accepted, for every model (the stand-in has no model catalogue):
# Claude 3.7 Sonnet's 128K output with its extended-output beta, as large as any Bedrock
# model's limit. Bedrock refuses a larger one with a ValidationException; accepted, any count
# at all would reach CloudWatch, and from there the reconciler.
MAX_OUTPUT_TOKENS = 128_000
# (model, prefix) digests kept for prompt caching: ~1.5 MB at most (~140 B an entry).
PROMPT_CACHE_ENTRIES = 10_000
CHARS_PER_TOKEN = 4
REPLY_TEXT = "This is the local Bedrock stand-in."
METRICS_NAMESPACE = "AWS/Bedrock"
_RUNTIME_PATH = re.compile(
    r"^/model/(?P<model>[^/]+)/(?P<operation>converse|converse-stream|invoke|invoke-with-response-stream)$"
)


def event_message(headers: dict[str, str], payload: dict) -> bytes:
    """One message of AWS's event-stream encoding (what ConverseStream answers in): prelude
    (total and headers length, CRC32), string headers, JSON payload, CRC32."""
    encoded_headers = b"".join(
        len(name).to_bytes(1, "big") + name.encode() + b"\x07" + len(value).to_bytes(2, "big") + value.encode()
        for name, value in headers.items()
    )
    body = json.dumps(payload).encode()
    total = 12 + len(encoded_headers) + len(body) + 4
    prelude = total.to_bytes(4, "big") + len(encoded_headers).to_bytes(4, "big")
    message = prelude + zlib.crc32(prelude).to_bytes(4, "big") + encoded_headers + body
    return message + zlib.crc32(message).to_bytes(4, "big")


def stream_event(event_type: str, payload: dict) -> bytes:
    return event_message(
        {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}, payload
    )


@functools.lru_cache(maxsize=len(REGIONS))
def _cloudwatch(region: str):
    """The Region's CloudWatch client. ``respond`` refuses Regions not in ``REGIONS`` before
    this runs, so there is at most one client per listed Region."""
    return boto3.client("cloudwatch", region_name=region)


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


class Runtime:
    """Converse, ConverseStream, InvokeModel and InvokeModelWithResponseStream with token
    counts derived from the request;
    every call's ``AWS/Bedrock`` metrics go to the local CloudWatch."""

    def __init__(self, prompt_cache_entries: int = PROMPT_CACHE_ENTRIES):
        self._lock = threading.Lock()
        self._prompt_cache_entries = prompt_cache_entries
        self._cached: OrderedDict[bytes, None] = OrderedDict()  # (model, prefix) digests, least recently used first

    @staticmethod
    def serves(path: str) -> bool:
        return _RUNTIME_PATH.match(path) is not None

    def respond(self, method: str, path: str, region: str, body: bytes | None) -> dict:
        match = _RUNTIME_PATH.match(path)
        try:
            _check_served(region)
            if method != "POST" or not match:
                raise BedrockError("UnknownOperationException", 400, "Unknown bedrock-runtime operation")
            model, operation = unquote(match["model"]), match["operation"]
            request = _json(body)
            echoed = _service_tier(request)
            usage = self.usage(model, request)
            self.record_metrics(region, model, usage)
        except BedrockError as error:
            return {
                "statusCode": error.status,
                "headers": {"Content-Type": "application/json", "x-amzn-ErrorType": error.code},
                "body": json.dumps({"message": error.message}),
            }
        if operation == "converse-stream":
            return {
                "statusCode": 200,
                "headers": {"Content-Type": "application/vnd.amazon.eventstream"},
                "body": b"".join(self._stream(usage, echoed)),
            }
        if operation == "invoke":
            return invoke_answer(request, usage)
        if operation == "invoke-with-response-stream":
            return invoke_stream_answer(request, usage)
        answer = {
            "output": {"message": {"role": "assistant", "content": [{"text": REPLY_TEXT}]}},
            "stopReason": "end_turn",
            "usage": usage,
            "metrics": {"latencyMs": 1},
            **echoed,
        }
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(answer)}

    def usage(self, model: str, request: dict) -> dict:
        """The call's ``usage`` as Bedrock reports it, from the request's text and ``maxTokens``."""
        text, cached_prefix, ttl = "", None, None
        for block in _blocks(request):
            if "cachePoint" in block:
                cached_prefix, ttl = text, (block["cachePoint"] or {}).get("ttl")
            else:
                text += block.get("text", "")
        output = _output_tokens(request)
        cache_read = cache_write = 0
        if cached_prefix:
            first = self._cache(model, cached_prefix)
            cache_write, cache_read = (_text_tokens(cached_prefix), 0) if first else (0, _text_tokens(cached_prefix))
            text = text[len(cached_prefix) :]
        usage = {"inputTokens": max(1, _text_tokens(text)), "outputTokens": output}
        usage["totalTokens"] = usage["inputTokens"] + output + cache_read + cache_write
        if cached_prefix:
            usage["cacheReadInputTokens"], usage["cacheWriteInputTokens"] = cache_read, cache_write
        if cache_write and ttl:  # a cache point with a TTL: the writes by TTL, as Bedrock splits them
            usage["cacheDetails"] = [{"ttl": ttl, "inputTokens": cache_write}]
        return usage

    def _cache(self, model: str, prefix: str) -> bool:
        """Whether ``prefix`` is written to ``model``'s prompt cache (else read from it). Only
        a digest of the two is kept, and only the ``prompt_cache_entries`` most recently used:
        the prefixes callers send are unbounded, the stand-in's memory is not."""
        key = hashlib.sha256(model.encode() + b"\0" + prefix.encode()).digest()
        with self._lock:
            first = key not in self._cached
            self._cached[key] = None
            self._cached.move_to_end(key)
            if len(self._cached) > self._prompt_cache_entries:
                self._cached.popitem(last=False)
        return first

    @staticmethod
    def record_metrics(region: str, model: str, usage: dict) -> None:
        """PutMetricData of one invocation, named and dimensioned as Bedrock publishes it."""
        values = {
            "Invocations": 1,
            "InputTokenCount": usage["inputTokens"],
            "OutputTokenCount": usage["outputTokens"],
            "CacheReadInputTokenCount": usage.get("cacheReadInputTokens", 0),
            "CacheWriteInputTokenCount": usage.get("cacheWriteInputTokens", 0),
        }
        _cloudwatch(region).put_metric_data(
            Namespace=METRICS_NAMESPACE,
            MetricData=[
                {"MetricName": name, "Dimensions": [{"Name": "ModelId", "Value": model}], "Value": value}
                for name, value in values.items()
            ],
        )

    @staticmethod
    def _stream(usage: dict, echoed: dict):
        half = len(REPLY_TEXT) // 2
        yield stream_event("messageStart", {"role": "assistant"})
        for piece in (REPLY_TEXT[:half], REPLY_TEXT[half:]):
            yield stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}})
        yield stream_event("contentBlockStop", {"contentBlockIndex": 0})
        yield stream_event("messageStop", {"stopReason": "end_turn"})
        yield stream_event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}, **echoed})


SERVICE_TIERS = ("priority", "default", "flex", "reserved")


def _service_tier(request: dict) -> dict:
    """The request's ``serviceTier``, which Bedrock's answer repeats ({} without one); its
    ValidationException for a type it does not know."""
    tier = request.get("serviceTier")
    if tier is None:
        return {}
    if not isinstance(tier, dict) or tier.get("type") not in SERVICE_TIERS:
        raise _invalid(f"serviceTier.type must be one of {', '.join(SERVICE_TIERS)}")
    return {"serviceTier": {"type": tier["type"]}}


def _is_anthropic(request: dict) -> bool:
    """An InvokeModel body in Anthropic's Messages shape (else Nova's ``messages-v1``)."""
    return "anthropic_version" in request or "max_tokens" in request


def _invocation_metrics(usage: dict) -> dict:
    """The ``amazon-bedrock-invocationMetrics`` of a stream's last chunk."""
    metrics = {"inputTokenCount": usage["inputTokens"], "outputTokenCount": usage["outputTokens"]}
    for name in ("cacheReadInputTokens", "cacheWriteInputTokens"):
        if name in usage:
            metrics[name.replace("Tokens", "TokenCount")] = usage[name]
    return {**metrics, "invocationLatency": 1, "firstByteLatency": 1}


def invoke_answer(request: dict, usage: dict) -> dict:
    """InvokeModel's answer: the provider's body (Anthropic's Messages or Nova's) and the
    provider-independent ``X-Amzn-Bedrock-*-Token-Count`` headers."""
    if _is_anthropic(request):
        answer = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": REPLY_TEXT}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": usage["inputTokens"], "output_tokens": usage["outputTokens"]},
        }
    else:
        answer = {
            "output": {"message": {"role": "assistant", "content": [{"text": REPLY_TEXT}]}},
            "stopReason": "end_turn",
            "usage": usage,
        }
    headers = {
        "Content-Type": "application/json",
        "X-Amzn-Bedrock-Input-Token-Count": str(usage["inputTokens"]),
        "X-Amzn-Bedrock-Output-Token-Count": str(usage["outputTokens"]),
    }
    return {"statusCode": 200, "headers": headers, "body": json.dumps(answer)}


def invoke_stream_answer(request: dict, usage: dict) -> dict:
    """InvokeModelWithResponseStream's answer: ``chunk`` events carrying the provider's stream
    chunks (base64 in ``bytes``), the last with ``amazon-bedrock-invocationMetrics``."""
    half = len(REPLY_TEXT) // 2
    if _is_anthropic(request):
        chunks = [
            {
                "type": "message_start",
                "message": {"role": "assistant", "usage": {"input_tokens": usage["inputTokens"]}},
            },
            *(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                for piece in (REPLY_TEXT[:half], REPLY_TEXT[half:])
            ),
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": usage["outputTokens"]},
            },
            {"type": "message_stop"},
        ]
    else:
        chunks = [
            {"messageStart": {"role": "assistant"}},
            *(
                {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": piece}}}
                for piece in (REPLY_TEXT[:half], REPLY_TEXT[half:])
            ),
            {"messageStop": {"stopReason": "end_turn"}},
            {"metadata": {"usage": usage}},
        ]
    chunks[-1]["amazon-bedrock-invocationMetrics"] = _invocation_metrics(usage)
    body = b"".join(
        stream_event("chunk", {"bytes": base64.b64encode(json.dumps(chunk).encode()).decode()}) for chunk in chunks
    )
    return {"statusCode": 200, "headers": {"Content-Type": "application/vnd.amazon.eventstream"}, "body": body}


def _blocks(request: dict) -> list[dict]:
    """The content blocks of ``system`` and of every message, in order; Bedrock's
    ValidationException for a request of another shape."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages is required: a non-empty list of messages")
    system = request.get("system")
    blocks = [] if system is None else _content(system, "system")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages.{index} must be an object")
        blocks += _content(message.get("content"), f"messages.{index}.content")
    return blocks


def _content(content, member: str) -> list[dict]:
    """Content as blocks: a list of blocks (Converse) or a string, one text block (the system
    prompt and messages of InvokeModel's Anthropic bodies)."""
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise _invalid(f"{member} must be a list of content blocks")
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("text", ""), str):
            raise _invalid(f"{member}.{index} must be a content block (an object whose text is a string)")
    return content


def _output_tokens(request: dict) -> int:
    """The output tokens a call is answered with: ``inferenceConfig.maxTokens`` (Converse) or
    ``max_tokens`` (InvokeModel's Anthropic body), else ``DEFAULT_OUTPUT_TOKENS``. Values
    outside 1 to ``MAX_OUTPUT_TOKENS`` get the ValidationException Bedrock answers."""
    config = {} if request.get("inferenceConfig") is None else request["inferenceConfig"]
    if not isinstance(config, dict):
        raise _invalid("inferenceConfig must be an object")
    member = "inferenceConfig.maxTokens" if "maxTokens" in config else "max_tokens"
    limit = config.get("maxTokens", request.get("max_tokens"))
    if limit is None:
        return DEFAULT_OUTPUT_TOKENS
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise _invalid(
            f"1 validation error detected: Value '{str(limit)[:64]}' at '{member}' "
            "failed to satisfy constraint: Member must be an integer greater than or equal to 1"
        )
    if limit > MAX_OUTPUT_TOKENS:
        raise _invalid(
            f"The maximum tokens you requested exceeds the model limit of {MAX_OUTPUT_TOKENS}. "
            f"Try again with a maximum tokens value that is lower than {MAX_OUTPUT_TOKENS}."
        )
    return limit
