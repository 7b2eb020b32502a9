"""The CDK app synthesized once per session (a synth takes seconds), offline.

``bundleLayer=false`` keeps pip off the network: the layer asset is its source directory
(``test_layer.py`` bundles it for real).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

import app as cdk_app  # noqa: E402
from stacks import REPO_ROOT  # noqa: E402

# Context of the second synthesis: every optional feature on.
OPTIONS = {
    "stage": "prod",
    "tablePrefix": "pk-",
    "enableStreams": "true",
    "corsOrigins": "https://a.example, https://b.example",
    "alertEmail": "ops@example.com",
    "alertWebhookUrl": "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
    "throttleRateLimit": "50",
    "throttleBurstLimit": "80",
    "accountConcurrency": "1000",  # room for the reservations (``reserveConcurrency=auto``)
    "tracing": "all",
}

# Context of a fourth: a new account's first create (docs/infrastructure.md, "First deploy"),
# with access logs off.
NEW_ACCOUNT = {"accountConcurrency": "50", "deletionProtection": "false", "accessLogs": "false"}

# Context of the third: the REST API (``-c apiKind=rest``), with CORS and throttling set.
REST = {
    "apiKind": "rest",
    "corsOrigins": OPTIONS["corsOrigins"],
    "throttleRateLimit": OPTIONS["throttleRateLimit"],
    "throttleBurstLimit": OPTIONS["throttleBurstLimit"],
}


@dataclass
class Synthesized:
    stack: cdk.Stack
    template: Template
    json: dict
    outdir: Path  # the cloud assembly, with cdk-nag's validation-report.json

    def resources(self, resource_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == resource_type}

    def id_of(self, construct) -> str:
        """Logical id of an L2 construct's CloudFormation resource."""
        return self.stack.get_logical_id(construct.node.default_child)

    def function_ids(self) -> dict[str, str]:
        return {name: self.id_of(fn) for name, fn in self.stack.functions.by_name.items()}

    def role_ids(self) -> dict[str, str]:
        return {name: self.id_of(fn.role) for name, fn in self.stack.functions.by_name.items()}

    def table_ids(self) -> dict:
        return {spec: self.id_of(table) for spec, table in self.stack.tables.by_spec.items()}


def build(outdir: Path, **context):
    """The app as ``app.py`` builds it, with ``cdk.json``'s context and ``context``; not synthesized yet."""
    defaults = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return cdk_app.build(cdk.App(outdir=str(outdir), context={**defaults, "bundleLayer": "false", **context}))


def _synth(tmp: Path, **context) -> Synthesized:
    stack = build(tmp / "cdk.out", **context)
    template = Template.from_stack(stack)  # fails on any finding of cdk-nag nobody acknowledged
    return Synthesized(stack, template, template.to_json(), tmp / "cdk.out")


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Synthesized:
    """The app as ``cdk.json`` configures it (stage ``dev``)."""
    return _synth(tmp_path_factory.mktemp("synth-default"))


@pytest.fixture(scope="session")
def synth_options(tmp_path_factory) -> Synthesized:
    """The app with every optional feature switched on (``OPTIONS``)."""
    return _synth(tmp_path_factory.mktemp("synth-options"), **OPTIONS)


@pytest.fixture(scope="session")
def synth_rest(tmp_path_factory) -> Synthesized:
    """The app behind a REST API (``REST``)."""
    return _synth(tmp_path_factory.mktemp("synth-rest"), **REST)


@pytest.fixture(scope="session")
def synth_new_account(tmp_path_factory) -> Synthesized:
    """The app as a new account's first create synthesizes it (``NEW_ACCOUNT``)."""
    return _synth(tmp_path_factory.mktemp("synth-new-account"), **NEW_ACCOUNT)
