"""Bedrock's control plane: the Regions there are, what an inference profile routes to
(GetInferenceProfile: its kind and the model of each Region), and a foundation model's name
(GetFoundationModel's, which is the Price List's).

A profile's kind selects its price: a system profile's id prefix names it (``global.``, or a
geography); an application profile's models show it (Region-less: global; several Regions:
geographic; one: in-region).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.loaders import create_loader

from .. import state
from ..config import GEOGRAPHIC, GLOBAL, IN_REGION
from ..errors import invalid_request, service_unavailable
from ..observability import logger
from . import RETRIES

PROFILE_ARN = re.compile(
    r"^arn:(?P<partition>aws|aws-cn|aws-us-gov):bedrock:(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d):(?P<account>\d{12}):"
    r"(?P<kind>inference-profile|application-inference-profile)/(?P<id>[A-Za-z0-9][A-Za-z0-9._:-]{0,127})$"
)
# A global profile lists its model once without a Region (``arn:aws:bedrock:::foundation-model/...``).
_FOUNDATION_MODEL_ARN = re.compile(r"^arn:[a-z-]+:bedrock:(?P<region>[a-z0-9-]*):\d*:foundation-model/(?P<model>.+)$")
GLOBAL_PROFILE_PREFIX = "global."


@lru_cache(maxsize=1)
def known_regions() -> frozenset[tuple[str, str]]:
    """(partition, region) of every AWS Region botocore knows (its endpoint data)."""
    partitions = create_loader().load_data("endpoints")["partitions"]
    return frozenset((partition["partition"], region) for partition in partitions for region in partition["regions"])


def is_known_region(region: str) -> bool:
    """Whether ``region`` is a Region of any partition."""
    return any(known == region for _, known in known_regions())


@lru_cache(maxsize=64)  # more than AWS has Regions
def bedrock_client(region: str):
    """Bedrock's client of a known Region (refused for any other: no client, no memory)."""
    if not is_known_region(region):
        raise ValueError(f"unknown AWS region {region[:64]}")
    return boto3.client(
        "bedrock",
        region_name=region,
        config=RETRIES,
    )


state.kept(bedrock_client.cache_clear)


class Routing(NamedTuple):
    """What GetInferenceProfile says: the kind, the model of each Region, and a global profile's model."""

    kind: str
    by_region: dict[str, str]
    anywhere: str | None = None


def _kind(arn: str, by_region: dict[str, str], anywhere: str | None) -> str:
    parsed = PROFILE_ARN.match(arn)
    if parsed["kind"] == "inference-profile":  # system-defined: the id's prefix names the geography
        return GLOBAL if parsed["id"].startswith(GLOBAL_PROFILE_PREFIX) else GEOGRAPHIC
    if anywhere is not None:
        return GLOBAL
    return GEOGRAPHIC if len(by_region) > 1 else IN_REGION


def inference_profile(arn: str) -> Routing:
    """GetInferenceProfile of ``arn``: 400 for a profile this account cannot read, 503 when Bedrock fails."""
    try:
        reply = bedrock_client(PROFILE_ARN.match(arn)["region"]).get_inference_profile(inferenceProfileIdentifier=arn)
    except ClientError as error:
        code = error.response["Error"]["Code"]
        if code in ("ResourceNotFoundException", "ValidationException"):
            raise invalid_request("Inference profile not found in AWS Bedrock", inference_profile_arn=arn) from None
        if code == "AccessDeniedException":  # the role may read its own account's profiles only
            raise invalid_request(
                "Inference profile not accessible: it must belong to the service's AWS account",
                inference_profile_arn=arn,
            ) from None
        logger.warning("GetInferenceProfile failed", extra={"aws_error": code})
        raise service_unavailable("Inference profile details unavailable; retry") from None
    except BotoCoreError as error:
        logger.warning("GetInferenceProfile unreachable", extra={"error_type": type(error).__name__})
        raise service_unavailable("Inference profile details unavailable; retry") from None
    by_region, anywhere = {}, None
    for model in reply.get("models", []):
        parsed = _FOUNDATION_MODEL_ARN.match(model.get("modelArn", ""))
        if parsed and parsed["region"]:
            by_region.setdefault(parsed["region"], parsed["model"])
        elif parsed:
            anywhere = anywhere or parsed["model"]
    return Routing(_kind(arn, by_region, anywhere), by_region, anywhere)


def foundation_model_name(model_id: str, region: str) -> str | None:
    """The model's Price List name (GetFoundationModel's ``modelName``); None (logged) when unavailable."""
    try:
        reply = bedrock_client(region).get_foundation_model(modelIdentifier=model_id)
    except (ClientError, BotoCoreError) as error:
        logger.warning(
            "foundation model name unavailable", extra={"model_id": model_id, "error_type": type(error).__name__}
        )
        return None
    return reply["modelDetails"]["modelName"]
