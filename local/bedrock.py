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
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
import threading
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

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
