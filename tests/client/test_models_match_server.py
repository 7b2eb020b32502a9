"""The client's models (``price_keeper_client.models``, written by hand) in step with the
server: field names and JSON types, checked against what the local server publishes.

Each model names its counterpart in ``WIRE``: a schema of the served ``/openapi.json`` (every
reply has one: tests/test_openapi_document.py checks the answers against them), or, where a
model stands for a view over several replies or a part of one, the real answers of the
server, merged over a few calls. Every field must exist there with a JSON
type its annotation accepts, and every key of the object a model stands for must be a field
of it, or be named in ``left_in_raw`` (the model keeps the whole answer in ``raw``), so a
field the server adds, renames or retypes fails here until the client follows.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import requests

from price_keeper_client import models
from price_keeper_client.models import (
    BatchItemResult,
    BatchResult,
    CarriedSelection,
    Credentials,
    DailySpend,
    LabelQuota,
    LabelSpend,
    ModelChoice,
    Pricing,
    Provisioned,
    Reservation,
    ReservationSettlement,
    Rotation,
    ScopeTotal,
    UsageReceipt,
    UsageRecord,
)

from .conftest import ORG_DEFAULTS, wait_for

pytestmark = pytest.mark.e2e

API = "/api/v1/orgs"


# --- shapes: the names and JSON types of a schema or of answers ----------------------------


@dataclass
class Shape:
    types: set[str] = field(default_factory=set)
    properties: dict[str, Shape] = field(default_factory=dict)
    members: Shape | None = None  # an array's items, or every value of an object used as a map

    def find(self, path: str) -> Shape | None:
        """The shape at a dotted path; ``*`` steps into ``members``; ``""`` is this shape."""
        shape: Shape | None = self
        for step in filter(None, path.split(".")):
            shape = shape.members if step == "*" else shape.properties.get(step)
            if shape is None:
                return None
        return shape


def of_answers(values: list) -> Shape:
    shape = Shape()
    for value in values:
        shape.types.add(
            {
                bool: "boolean",
                int: "integer",
                float: "number",
                str: "string",
                type(None): "null",
                dict: "object",
                list: "array",
            }[type(value)]
        )
    objects = [value for value in values if isinstance(value, dict)]
    for key in dict.fromkeys(key for value in objects for key in value):
        shape.properties[key] = of_answers([value[key] for value in objects if key in value])
    members = [
        member
        for value in values
        if isinstance(value, (dict, list))
        for member in (value.values() if isinstance(value, dict) else value)
    ]
    if members:
        shape.members = of_answers(members)
    return shape


def of_schema(schema: dict, document: dict) -> Shape:
    if "$ref" in schema:
        return of_schema(document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]], document)
    shape = Shape()
    for alternative in schema.get("anyOf", []) + schema.get("oneOf", []):
        found = of_schema(alternative, document)
        shape.types |= found.types
        shape.properties |= found.properties
        shape.members = shape.members or found.members
    kinds = schema.get("type", [])
    shape.types |= {kinds} if isinstance(kinds, str) else set(kinds)
    shape.properties |= {name: of_schema(sub, document) for name, sub in schema.get("properties", {}).items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            shape.members = of_schema(schema[key], document)
    return shape


def json_types(annotation) -> set[str]:
    """The JSON types a field of this annotation takes; a collection of models may come as an
    array or as an object keyed by one of their fields."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set().union(*(json_types(arg) for arg in typing.get_args(annotation)))
    origin = typing.get_origin(annotation) or annotation
    if origin in (tuple, list):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        return {"array", "object"} if args and dataclasses.is_dataclass(args[0]) else {"array"}
    if dataclasses.is_dataclass(origin) or origin is dict:
        return {"object"}
    return {
        bool: {"boolean"},
        int: {"integer"},
        float: {"number", "integer"},
        str: {"string"},
        datetime: {"string"},
        type(None): {"null"},
    }[origin]


# --- what each model stands for -------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    source: str  # "schema:<name>" in /openapi.json, or an answer recorded by the ``answers`` fixture
    at: str = ""  # the object the model stands for, within the source
    paths: dict = field(default_factory=dict)  # field -> path under ``at`` (a tuple: assembled from several keys)
    left_in_raw: frozenset[str] = frozenset()  # keys of that object the model leaves to ``raw``
    partial: bool = False  # a view of a few keys: the object's other keys are not checked
    not_sent: frozenset[str] = frozenset()  # fields read from other servers' answers, which this one never sends


WIRE = {
    UsageRecord: Wire("schema:UsageRequest"),
    Pricing: Wire("selection", "pricing"),
    ModelChoice: Wire(
        "selection",
        paths={
            "label": "recommended_model.label",
            "bedrock_model_id": "recommended_model.bedrock_model_id",
            "reason": "recommended_model.reason",
            "mode": "quota_status.mode",
            "quota_pct": "quota_status.quota_pct",
            "cache_duration_secs": "client_guidance.cache_duration_secs",
            "check_frequency": "client_guidance.check_frequency",
        },
        left_in_raw=frozenset({"org_id", "app_id", "org_local_time"}),
    ),
    UsageReceipt: Wire(
        "usage",
        paths={
            "shard_id": "processing.shard_id",
            "cost_usd_micros": "processing.cost_usd_micros",
            "quota": "daily_total",
            "total": "scope_total",
            "selection": "model_selection",
        },
        left_in_raw=frozenset({"message", "timestamp", "pricing"}),
    ),
    CarriedSelection: Wire("usage", paths={"choice": "model_selection"}, partial=True),
    LabelQuota: Wire("usage", "daily_total", partial=True, not_sent=frozenset({"reason"})),
    ScopeTotal: Wire("usage", "scope_total"),
    ReservationSettlement: Wire("usage", "reservation"),
    BatchResult: Wire(
        "batch",
        paths={"quotas": "daily_totals", "total": "scope_total", "selection": "model_selection"},
        left_in_raw=frozenset({"timestamp"}),
    ),
    BatchItemResult: Wire("batch", "results.*"),
    DailySpend: Wire("aggregates", paths={"labels": "models"}),
    LabelSpend: Wire("aggregates", "models.*"),
    Credentials: Wire("schema:ClientCredentials"),
    Provisioned: Wire("provisioned"),
    Reservation: Wire("schema:Reservation"),
    Rotation: Wire(
        "schema:RotatedCredentials",
        paths={
            "credentials": ("client_id", "client_secret"),
            "rotated_at": "rotation.rotated_at",
            "old_secret_expires_at": "rotation.old_secret_expires_at",
            "grace_period_hours": "rotation.grace_period_hours",
        },
    ),
}


def problems(model: type, wire: Wire, source: Shape) -> list[str]:
    """Where ``model`` and the server disagree, in words; empty when they agree."""
    target = source.find(wire.at)
    if target is None:
        return [f"the server sends no {wire.at!r}"]
    hints = typing.get_type_hints(model)
    found: list[str] = []
    read: set[str] = set()
    for name in (item.name for item in dataclasses.fields(model) if item.name != "raw"):
        paths = wire.paths.get(name, name)
        for path in paths if isinstance(paths, tuple) else (paths,):
            read.add(path.split(".")[0])
            shape = target.find(path)
            if (shape is None) != (name in wire.not_sent):
                found.append(
                    f"{name}: "
                    + (
                        f"the server sends no {path!r}"
                        if shape is None
                        else f"the server now sends {path!r}: take it off not_sent"
                    )
                )
            elif shape is not None and not isinstance(paths, tuple) and not shape.types <= json_types(hints[name]):
                found.append(
                    f"{name}: the server sends {sorted(shape.types)} at {path!r}, the model takes {hints[name]}"
                )
    if not wire.partial:
        found += [
            f"the server's {key!r} is not modelled"
            for key in sorted(target.properties.keys() - read - wire.left_in_raw)
        ]
        found += [
            f"{key!r} is in left_in_raw but " + ("modelled" if key in read else "not sent")
            for key in sorted(wire.left_in_raw & read | wire.left_in_raw - target.properties.keys())
        ]
    return found


# --- the server's answers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def answers(server) -> dict[str, Shape]:
    """Shapes of the served OpenAPI schemas (``schema:<name>``) and of real answers: an org and
    an app provisioned then updated, a model selection, a usage report with cache tokens, a
    batch with an accepted and a refused record (both reports settling a reservation), the
    day's aggregates once folded."""
    admin = {"X-API-Key": server.api_key}

    def call(method: str, path: str, expected: int, **kwargs) -> dict:
        reply = requests.request(method, server.url + path, timeout=30, **kwargs)
        assert reply.status_code == expected, reply.text
        return reply.json()

    org_id, app = str(uuid.uuid4()), f"{API}/{{}}/apps/models-app"
    org = call("PUT", f"{API}/{org_id}", 201, headers=admin, json=ORG_DEFAULTS)
    created = call("PUT", app.format(org_id), 201, headers=admin, json={"app_name": "models"})
    updated = call("PUT", app.format(org_id), 200, headers=admin, json={"app_name": "models, renamed"})
    token = call("POST", "/auth/token", 200, json={**created["credentials"], "grant_type": "client_credentials"})
    bearer = {"Authorization": f"Bearer {token['access_token']}"}
    held = [
        call(
            "POST",
            f"{app.format(org_id)}/reservations",
            201,
            headers=bearer,
            json={
                "max_input_tokens": 2_000,
                "max_output_tokens": 1_000,
                "max_cache_write_input_tokens": 100,
                "model_label": "premium",
            },
        )["reservation_id"]
        for _ in range(2)
    ]
    record = UsageRecord(
        str(uuid.uuid4()),
        "premium",
        "amazon.nova-pro-v1:0",
        1_000,
        200,
        datetime.now(UTC),
        calling_region="us-east-1",
        cache_read_input_tokens=300,
        cache_write_input_tokens=100,
        reservation_id=held[0],
    )
    asks = {"model_selection": "true"}  # the reports carry the selection (CarriedSelection)
    recorded = {
        "provisioned": [org, created, updated],
        "selection": [call("GET", f"{app.format(org_id)}/model-selection", 200, headers=bearer)],
        "usage": [call("POST", f"{app.format(org_id)}/usage", 202, headers=bearer, json=record.to_json(), params=asks)],
        "batch": [
            call(
                "POST",
                f"{app.format(org_id)}/usage/batch",
                207,
                headers=bearer,
                params=asks,
                json={
                    "requests": [
                        dataclasses.replace(record, request_id=str(uuid.uuid4()), reservation_id=held[1]).to_json(),
                        {"request_id": "not-a-uuid"},
                    ]
                },
            )
        ],
    }
    recorded["aggregates"] = [
        wait_for(
            lambda: (lambda today: today if today["models"]["premium"]["requests"] == 2 else None)(
                call("GET", f"{app.format(org_id)}/aggregates/today", 200, headers=bearer)
            )
        )
    ]
    assert recorded["aggregates"] != [None], "the aggregator never folded the usage"
    shapes = {name: of_answers(values) for name, values in recorded.items()}
    document = call("GET", "/openapi.json", 200)
    shapes |= {
        f"schema:{name}": of_schema(schema, document) for name, schema in document["components"]["schemas"].items()
    }
    return shapes


def test_every_client_model_has_a_counterpart():
    defined = {
        cls
        for _, cls in inspect.getmembers(models, inspect.isclass)
        if dataclasses.is_dataclass(cls) and cls.__module__ == models.__name__
    }
    assert defined == set(WIRE)


@pytest.mark.parametrize("model", list(WIRE), ids=lambda model: model.__name__)
def test_client_model_matches_the_server(model, answers):
    found = problems(model, WIRE[model], answers[WIRE[model].source])
    assert not found, f"{model.__name__} and the server disagree:\n" + "\n".join(found)


def test_the_check_sees_a_dropped_field_and_a_wrong_type(answers):
    @dataclass(frozen=True)
    class TwoPrices:  # the client's Pricing before it took the cache prices
        input_price_usd_micros_per_1m: int
        output_price_usd_micros_per_1m: str
        version: str | None = None
        source: str | None = None
        profile_kind: str | None = None

    found = problems(TwoPrices, WIRE[Pricing], answers["selection"])
    assert found == [
        "output_price_usd_micros_per_1m: the server sends ['integer'] at "
        "'output_price_usd_micros_per_1m', the model takes <class 'str'>",
        "the server's 'cache_read_price_usd_micros_per_1m' is not modelled",
        "the server's 'cache_write_price_usd_micros_per_1m' is not modelled",
    ]
