"""Inference profiles and label resolution: an app can register Bedrock inference profiles under its own labels; a
usage label resolves to a config.yaml label or the app's profile.

A profile's billed model depends on the calling region, as GetInferenceProfile answers (``aws.bedrock``, memoized; AWS
is the source of truth); registration asks it too, so a profile the service cannot resolve is refused up front.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from ..aws import bedrock
from ..aws.bedrock import PROFILE_ARN
from ..cache import TTLCache
from ..config import IN_REGION, Prices, get_config
from ..errors import ApiError, invalid_request
from ..store import profiles as profile_store
from ..store.dynamo import ConditionFailed
from ..timeutil import iso_utc, utc_now
from .orgs import EffectiveConfig

PROFILE_CACHE_SECONDS = 30  # same as the config cache: a registration reaches other containers within it
ROUTING_CACHE_SECONDS = 3600

_profiles = TTLCache(PROFILE_CACHE_SECONDS)
_routing = TTLCache(ROUTING_CACHE_SECONDS)


class Profile(NamedTuple):
    label: str
    arn: str

    @property
    def home_region(self) -> str:
        return PROFILE_ARN.match(self.arn)["region"]


def check_profile_arn(arn: str) -> None:
    """400 unless ``arn`` is a profile ARN of a known Region (before any Bedrock client exists for it)."""
    parsed = PROFILE_ARN.fullmatch(arn) if isinstance(arn, str) else None
    if parsed is None:
        raise invalid_request(f"Invalid inference profile ARN: {arn[:200]}")
    if (parsed["partition"], parsed["region"]) not in bedrock.known_regions():
        raise invalid_request(f"Invalid inference profile ARN: unknown AWS region {parsed['region']}")


def check_calling_region(region: str | None) -> None:
    """400 for a ``calling_region`` that is no AWS Region (before any price is read for it)."""
    if region is not None and not bedrock.is_known_region(region):
        raise invalid_request(f"Unknown AWS region: {region}", calling_region=region)


# Bounds the labels a scope can spend on (docs/metering.md, "Inference profiles"); concurrent
# registrations at the limit may pass it by the few in flight.
MAX_PROFILES_PER_APP = 400


def register(config: EffectiveConfig, label: str, arn: str, description: str | None, now=None) -> dict:
    """Store a profile under a new label of the app: 201 body; 400 for a bad ARN or one Bedrock does not resolve for
    this account, 409 when the label is taken, 503 when Bedrock fails."""
    check_profile_arn(arn)
    if label in get_config().labels:
        raise ApiError(
            409,
            "ALREADY_EXISTS",
            "Label is already defined in config.yaml",
            {"profile_label": label, "reason": "config_label"},
        )
    registered = len(profile_store.labels(config.org_id, config.app_id))
    if registered >= MAX_PROFILES_PER_APP:
        raise invalid_request(
            "Too many inference profiles registered for this app",
            limit=MAX_PROFILES_PER_APP,
            registered=registered,
        )
    _routing_of(arn)
    now = now or utc_now()
    if PROFILE_ARN.match(arn)["kind"] == "application-inference-profile":
        _claim(arn, config.org_id, label, now)
    item = {
        **profile_store.profile_key(config.org_id, config.app_id, label),
        "profile_label": label,
        "inference_profile_arn": arn,
        "created_at": iso_utc(now),
        "updated_at_epoch": int(now.timestamp()),
    }
    if description is not None:
        item["description"] = description
    try:
        profile_store.create(item)
    except ConditionFailed as taken:
        raise ApiError(
            409,
            "ALREADY_EXISTS",
            "Inference profile label already registered",
            {"profile_label": label, "registered_at": (taken.item or {}).get("created_at")},
        ) from None
    _profiles.discard((config.org_id, config.app_id, label))
    body = {"profile_label": label, "inference_profile_arn": arn, "status": "registered"}
    if description is not None:
        body["description"] = description
    body["created_at"] = item["created_at"]
    return body


def _claim(arn: str, org_id: str, label: str, now) -> None:
    """An application inference profile belongs to the first org to register it (409 for any
    other), so no org can take another's reconciliation alerts or spend."""
    if profile_store.claim(arn, org_id, int(now.timestamp())) != org_id:
        raise ApiError(
            409,
            "ALREADY_EXISTS",
            "This application inference profile is registered by another organization",
            {"profile_label": label, "reason": "profile_of_another_org"},
        )


def find_many(org_id: str, app_id: str | None, labels: Iterable[str]) -> dict[str, Profile | None]:
    """The app's registered profile of each of ``labels`` (None: none), cached; the uncached read together."""
    labels = list(dict.fromkeys(labels))
    if app_id is None:
        return dict.fromkeys(labels)

    def load(missing: list[tuple[str, str, str]]) -> dict:
        arns = profile_store.find_many(org_id, app_id, [label for _, _, label in missing])
        return {key: Profile(key[2], arns[key[2]]) if key[2] in arns else None for key in missing}

    found = _profiles.get_or_load_many([(org_id, app_id, label) for label in labels], load)
    return {label: profile for (_, _, label), profile in found.items()}


def _routing_of(arn: str) -> bedrock.Routing:
    """The profile's kind and models (GetInferenceProfile, memoized)."""
    return _routing.get_or_load(arn, lambda: bedrock.inference_profile(arn))


def model_for_region(profile: Profile, region: str) -> tuple[str, str]:
    """(foundation model id, profile kind) of the profile called in ``region``."""
    routing = _routing_of(profile.arn)
    model_id = routing.by_region.get(region) or routing.anywhere
    if model_id is None:
        raise invalid_request(
            f"Inference profile {profile.label} does not serve region {region}",
            model_label=profile.label,
            calling_region=region,
            profile_regions=sorted(routing.by_region),
        )
    return model_id, routing.kind


class PricedModel(NamedTuple):
    """What a label bills: the foundation model, the region whose price applies, how the call
    reaches it, and its config.yaml prices by kind (None outside config.yaml)."""

    label: str
    kind: str  # model | profile
    bedrock_id: str  # what the client calls: a model id or a profile ARN
    model_id: str
    region: str | None
    configured: dict[str, Prices] | None
    profile_kind: str = IN_REGION


def known_labels(config: EffectiveConfig, labels: Iterable[str]) -> dict[str, Profile | str | None]:
    """For each label: ``"config"`` (no read: registration refuses them), the app's profile, or None."""
    configured = get_config().labels
    labels = list(labels)
    registered = find_many(config.org_id, config.app_id, [label for label in labels if label not in configured])
    return {label: "config" if label in configured else registered[label] for label in labels}


def known_label(config: EffectiveConfig, label: str) -> Profile | str | None:
    return known_labels(config, [label])[label]


def bedrock_ids(config: EffectiveConfig, labels: Iterable[str]) -> dict[str, str | None]:
    """What a client passes to Bedrock for each of ``labels``: model id or profile ARN (None: unknown)."""
    configured = get_config().labels
    return {
        label: resolved.arn if isinstance(resolved, Profile) else (configured[label].id if resolved else None)
        for label, resolved in known_labels(config, labels).items()
    }


def bedrock_id(config: EffectiveConfig, label: str) -> str | None:
    return bedrock_ids(config, [label])[label]


def configured_for_model(model_id: str) -> dict[str, Prices] | None:
    for spec in get_config().labels.values():
        if spec.type == "model" and spec.id == model_id:
            return spec.configured_prices()
    return None


def priced_model(config: EffectiveConfig, label: str, calling_region: str | None) -> PricedModel:
    """Resolve a known label to the model and region it is billed at (a profile: ``calling_region``)."""
    check_calling_region(calling_region)
    resolved = known_label(config, label)
    if resolved is None:
        raise ValueError(f"unknown label {label}")
    if isinstance(resolved, Profile):
        return _priced_profile(resolved, None, calling_region)
    return priced_config_label(label, calling_region)


def priced_config_label(label: str, calling_region: str | None) -> PricedModel:
    """``priced_model`` of a config.yaml label: the same in every org and app (no read)."""
    spec = get_config().labels[label]
    if spec.type == "model":
        return PricedModel(label, "model", spec.id, spec.id, calling_region, spec.configured_prices())
    return _priced_profile(Profile(label, spec.id), spec.configured_prices(), calling_region)


def _priced_profile(profile: Profile, configured: dict[str, Prices] | None, calling_region: str | None) -> PricedModel:
    region = calling_region or profile.home_region
    model_id, kind = model_for_region(profile, region)
    return PricedModel(
        profile.label, "profile", profile.arn, model_id, region, configured or configured_for_model(model_id), kind
    )


_ANY_ARN = re.compile(r"^arn:[a-z-]+:bedrock:[a-z0-9-]*:\d*:[a-z-]+/(?P<id>.+)$")


def _resource(bedrock_id: str) -> str:
    """A Bedrock ARN's resource id (the model or profile id), else the id itself."""
    arn = _ANY_ARN.match(bedrock_id)
    return arn["id"] if arn else bedrock_id


def check_reported_model(priced: PricedModel, reported: str) -> None:
    """400 unless ``reported`` (``bedrock_model_id``) names what the label bills, in any form Bedrock takes (id, ARN,
    cross-Region prefix; for a profile any of its models): a misreport shows at once instead of under-counting."""
    models = [priced.model_id]
    if priced.kind == "profile":
        routing = _routing_of(priced.bedrock_id)
        models += [*routing.by_region.values(), *([routing.anywhere] if routing.anywhere else [])]
    accepted = {*models, priced.bedrock_id, _resource(priced.bedrock_id)}
    resource = _resource(reported)
    if {reported, resource, resource.partition(".")[2]} & accepted:
        return
    raise invalid_request(
        f"bedrock_model_id is not a model of model_label {priced.label}",
        model_label=priced.label,
        bedrock_model_id=reported[:200],
        label_bedrock_model_id=priced.bedrock_id,
        label_model_ids=list(dict.fromkeys(models)),
    )
