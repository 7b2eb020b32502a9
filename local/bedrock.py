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
by its ``/model/{modelId}/...`` paths): ``Converse``, ``ConverseStream`` and ``InvokeModel``
answer a canned reply whose token counts come from the request (about 4 characters of
text per input token; ``maxTokens``, default ``DEFAULT_OUTPUT_TOKENS``, output tokens; the
content before a ``cachePoint`` is written to the cache the first time and read from it
after), and each call records the ``AWS/Bedrock`` metrics AWS publishes (``Invocations``,
``InputTokenCount``, ``OutputTokenCount``, ``CacheReadInputTokenCount``,
``CacheWriteInputTokenCount``, by ``ModelId`` as the caller named it) in the local
CloudWatch (moto), which the reconciler reads.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import string
import threading
import zlib
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import boto3
import botocore.session
from botocore.exceptions import UnknownRegionError

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
_PARTITIONS = botocore.session.get_session()  # botocore's partition data: aws, aws-cn, aws-us-gov


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
        return _PARTITIONS.get_partition_for_region(region)
    except UnknownRegionError:
        raise _invalid(f"Unknown Region {region!r}") from None


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
    except ValueError:
        raise _invalid("The request body is not JSON") from None
    if not isinstance(request, dict):
        raise _invalid("The request body must be a JSON object")
    return request


# --- bedrock-runtime ---------------------------------------------------------------

DEFAULT_OUTPUT_TOKENS = 100
CHARS_PER_TOKEN = 4
REPLY_TEXT = "This is the local Bedrock stand-in."
METRICS_NAMESPACE = "AWS/Bedrock"
_RUNTIME_PATH = re.compile(r"^/model/(?P<model>[^/]+)/(?P<operation>converse|converse-stream|invoke)$")


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


@functools.cache
def _cloudwatch(region: str):
    return boto3.client("cloudwatch", region_name=region)


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


class Runtime:
    """Converse, ConverseStream and InvokeModel with token counts derived from the request;
    every call's ``AWS/Bedrock`` metrics go to the local CloudWatch."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cached: set[tuple[str, str]] = set()  # (model, prefix digest) written to the prompt cache

    @staticmethod
    def serves(path: str) -> bool:
        return _RUNTIME_PATH.match(path) is not None

    def respond(self, method: str, path: str, region: str, body: bytes | None) -> dict:
        match = _RUNTIME_PATH.match(path)
        try:
            if method != "POST" or not match:
                raise BedrockError("UnknownOperationException", 400, "Unknown bedrock-runtime operation")
            model, operation = unquote(match["model"]), match["operation"]
            request = _json(body)
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
                "body": b"".join(self._stream(usage)),
            }
        if operation == "invoke":
            answer = {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": REPLY_TEXT}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": usage["inputTokens"], "output_tokens": usage["outputTokens"]},
            }
            headers = {
                "X-Amzn-Bedrock-Input-Token-Count": str(usage["inputTokens"]),
                "X-Amzn-Bedrock-Output-Token-Count": str(usage["outputTokens"]),
            }
            return {
                "statusCode": 200,
                "headers": {"Content-Type": "application/json", **headers},
                "body": json.dumps(answer),
            }
        answer = {
            "output": {"message": {"role": "assistant", "content": [{"text": REPLY_TEXT}]}},
            "stopReason": "end_turn",
            "usage": usage,
            "metrics": {"latencyMs": 1},
        }
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(answer)}

    def usage(self, model: str, request: dict) -> dict:
        """The call's ``usage`` as Bedrock reports it, from the request's text and ``maxTokens``."""
        system = request.get("system") or []
        blocks = [{"text": system}] if isinstance(system, str) else list(system)
        for message in request.get("messages") or []:
            if not isinstance(message, dict):
                raise _invalid("messages must be objects")
            content = message.get("content")
            blocks += content if isinstance(content, list) else [{"text": content}] if isinstance(content, str) else []
        if not request.get("messages"):
            raise _invalid("messages is required")
        text, cached_prefix = "", None
        for block in blocks:
            if isinstance(block, dict) and "cachePoint" in block:
                cached_prefix = text
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                text += block["text"]
        limit = (request.get("inferenceConfig") or {}).get("maxTokens") or request.get("max_tokens")
        output = DEFAULT_OUTPUT_TOKENS if limit is None else limit
        if not isinstance(output, int) or isinstance(output, bool) or output < 1:
            raise _invalid("maxTokens must be a positive integer")
        cache_read = cache_write = 0
        if cached_prefix:
            key = (model, cached_prefix)
            with self._lock:
                first = key not in self._cached
                self._cached.add(key)
            cache_write, cache_read = (_text_tokens(cached_prefix), 0) if first else (0, _text_tokens(cached_prefix))
            text = text[len(cached_prefix) :]
        usage = {"inputTokens": max(1, _text_tokens(text)), "outputTokens": output}
        usage["totalTokens"] = usage["inputTokens"] + output + cache_read + cache_write
        if cached_prefix:
            usage["cacheReadInputTokens"], usage["cacheWriteInputTokens"] = cache_read, cache_write
        return usage

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
    def _stream(usage: dict):
        half = len(REPLY_TEXT) // 2
        yield stream_event("messageStart", {"role": "assistant"})
        for piece in (REPLY_TEXT[:half], REPLY_TEXT[half:]):
            yield stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}})
        yield stream_event("contentBlockStop", {"contentBlockIndex": 0})
        yield stream_event("messageStop", {"stopReason": "end_turn"})
        yield stream_event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}})
