"""cdk-nag's ``AwsSolutions`` pack on the app (``stacks/nag.py``): it runs on every synth,
no finding is left unacknowledged, each acknowledgment concerns one resource and says why,
and none is stale.

cdk-nag 3 is a CDK validation plugin, not an aspect that adds annotations: a finding fails
the synth, and every finding, acknowledged or not, is listed in the assembly's
``validation-report.json``. That report is what these tests read.
"""

from __future__ import annotations

import json

import pytest
from aws_cdk import Validations

pytestmark = pytest.mark.infra

PACK = "AwsSolutions"
# The rules the stack keeps a finding of, each reviewed (reasons in stacks/nag.py). A new one
# belongs here only after it is fixed where fixing is right, or acknowledged with its reason.
ACKNOWLEDGED_RULES = {"SMG4", "L1", "IAM5", "APIG4", "SQS3"}
# ... and behind a REST API (``apiKind=rest``): its account CloudWatch role, request
# validation, WAF, and the Cognito rule of its methods.
REST_API_RULES = {"IAM4", "APIG2", "APIG3", "COG4"}
VARIANTS = ["synth", "synth_options", "synth_rest"]


def _report(synthesized) -> dict:
    """The pack's report of a synth (the fixtures' synth would have failed on any finding left)."""
    (report,) = json.loads((synthesized.outdir / "validation-report.json").read_text())["pluginReports"]
    assert report["pluginName"] == PACK
    return report


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_pack_ran_and_left_no_finding(variant, request):
    """Errors and warnings alike."""
    report = _report(request.getfixturevalue(variant))
    assert report["conclusion"] == "success" and report["violations"] == []
    assert report["suppressedViolations"]


def _acknowledgments(stack) -> set[tuple[str, str]]:
    """(construct path, rule id) of every acknowledgment recorded in the stack."""
    return {
        (construct.node.path, rule)
        for construct in stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for rule in entry.data
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_acknowledgment_is_one_finding_on_the_resource_it_names_with_its_reason(variant, request):
    synthesized = request.getfixturevalue(variant)
    suppressed = _report(synthesized)["suppressedViolations"]
    for finding in suppressed:
        (construct,) = finding["violatingConstructs"]
        assert finding["acknowledgedAt"] == construct["constructPath"], finding  # no parent covering others
        assert finding["acknowledgedId"] == f"{PACK}::{finding['ruleName']}"
        assert len(finding["reason"].split()) >= 10, finding  # a reason, not a label
    used = {(finding["acknowledgedAt"], finding["acknowledgedId"]) for finding in suppressed}
    assert _acknowledgments(synthesized.stack) == used  # none for a finding the pack no longer makes


@pytest.mark.parametrize(
    "variant, expected", [("synth", ACKNOWLEDGED_RULES), ("synth_rest", ACKNOWLEDGED_RULES | REST_API_RULES)]
)
def test_the_acknowledged_rules_are_the_reviewed_ones(variant, expected, request):
    report = _report(request.getfixturevalue(variant))
    rules = {finding["ruleName"].removeprefix(f"{PACK}-").split("[")[0] for finding in report["suppressedViolations"]}
    assert rules == expected
