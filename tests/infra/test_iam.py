"""Least privilege: each function's role holds exactly what ``stacks/access.py`` grants."""

from __future__ import annotations

import pytest

from price_keeper import routes
from price_keeper.store.tables import ALL_TABLES, REVOKED_TOKENS, STICKY_STATE
from stacks import access
from stacks.functions import FUNCTIONS

from .cfn import referenced_ids, role_statements

pytestmark = pytest.mark.infra

# The only actions allowed on Resource "*": AWS offers no resource-level permission for them
# (ListStreams: the aggregator's event source mapping lists the usage table's streams).
WILDCARD_RESOURCE_ACTIONS = {
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "pricing:GetProducts",
    "dynamodb:ListStreams",
    "cloudwatch:GetMetricData",
    "cloudwatch:ListMetrics",
    "ce:GetCostAndUsage",
}


def _function_statements(synth) -> dict[str, list]:
    by_role = role_statements(synth.json)
    return {name: by_role[role_id] for name, role_id in synth.role_ids().items()}


def test_access_map_covers_every_function_with_plain_dynamodb_actions():
    assert set(access.TABLE_ACCESS) == set(FUNCTIONS)
    for grants in access.TABLE_ACCESS.values():
        for target, actions in grants.items():
            spec = target[0] if isinstance(target, tuple) else target
            assert spec in ALL_TABLES
            assert actions and all(a.startswith("dynamodb:") and "*" not in a for a in actions)


def test_rate_limited_functions_may_count_in_sticky_state():
    for route in routes.ROUTES:
        if route.rate_limit:
            assert "dynamodb:UpdateItem" in access.TABLE_ACCESS[route.function][STICKY_STATE], route


@pytest.mark.parametrize("name", FUNCTIONS)
def test_dynamodb_grants_are_exactly_the_access_map(synth, name):
    table_ids = {table_id: spec for spec, table_id in synth.table_ids().items()}
    granted: dict = {}
    for statement in _function_statements(synth)[name]:
        dynamo = [a for a in statement.actions if a.startswith("dynamodb:")]
        if not dynamo or statement.wildcard or _is_stream(statement):
            continue  # stream reads: tests/infra/test_stream_trigger.py
        assert len(dynamo) == len(statement.actions), "DynamoDB actions share a statement with others"
        for resource in statement.resources:
            (table_id,) = referenced_ids(resource)
            spec = table_ids[table_id]
            index = _index_of(resource, spec)
            target = (spec, index) if index else spec
            granted.setdefault(target, set()).update(dynamo)
    assert granted == {target: set(actions) for target, actions in access.TABLE_ACCESS[name].items()}


def _is_stream(statement) -> bool:
    return all(isinstance(r, dict) and r.get("Fn::GetAtt", [None, None])[1] == "StreamArn" for r in statement.resources)


def _index_of(resource, spec):
    """The index an ARN ``<table arn>/index/<name>`` names, else None."""
    if isinstance(resource, dict) and "Fn::Join" in resource:
        suffix = "".join(part for part in resource["Fn::Join"][1] if isinstance(part, str))
        for index in spec.indexes:
            if suffix == f"/index/{index.name}":
                return index
        raise AssertionError(f"unexpected resource suffix {suffix!r}")
    return None


def test_no_wildcard_actions_and_no_wildcard_resources_on_data(synth):
    for role_id, statements in role_statements(synth.json).items():
        for statement in statements:
            for action in statement.actions:
                assert action != "*" and not action.endswith(":*"), (role_id, action)
            if statement.wildcard:
                data = [a for a in statement.actions if a.startswith(("dynamodb:", "secretsmanager:"))]
                assert set(data) <= {"dynamodb:ListStreams"}, role_id


@pytest.mark.parametrize("name", FUNCTIONS)
def test_resource_star_only_where_aws_requires_it(synth, name):
    for statement in _function_statements(synth)[name]:
        if statement.wildcard:
            assert set(statement.actions) <= WILDCARD_RESOURCE_ACTIONS, (name, statement.actions)


def test_functions_have_no_managed_policies(synth):
    roles = synth.resources("AWS::IAM::Role")
    for name, role_id in synth.role_ids().items():
        assert not roles[role_id]["Properties"].get("ManagedPolicyArns"), name


def _secret_readers(synth, secret) -> set[str]:
    secret_id = synth.id_of(secret)
    return {
        name
        for name, statements in _function_statements(synth).items()
        if any("secretsmanager:GetSecretValue" in s.actions and secret_id in s.targets for s in statements)
    }


def test_signing_key_readable_only_by_token_endpoints_and_authorizing_functions(synth):
    assert _secret_readers(synth, synth.stack.jwt_secret) == access.JWT_READERS


def test_provisioning_key_readable_only_by_provisioning_endpoints(synth):
    assert _secret_readers(synth, synth.stack.provisioning_secret) == access.PROVISIONING_READERS
    assert access.PROVISIONING_READERS == {
        "put_org",
        "put_app",
        "rotate_credentials",
        "revoke_tokens",
        "quota_boosts",
        "reconciliation",
        "void_usage",
    }


def test_every_function_that_authorizes_reads_the_signing_key():
    """A bearer-token check reads RevokedTokens; it needs the signing key to verify the token first.
    (Rotation and revoke-tokens only write a client's cutoff there: they verify no token.)"""
    checks_tokens = {
        name for name, grants in access.TABLE_ACCESS.items() if access.BATCH_GET in grants.get(REVOKED_TOKENS, ())
    }
    assert checks_tokens <= access.JWT_READERS
    assert {"auth_token", "auth_refresh", "auth_revoke"} <= access.JWT_READERS


def test_only_alert_publishers_put_events_and_only_on_the_service_bus(synth):
    """The aggregator (spend alerts), the usage functions (UNPRICED_MODEL) and the reconciler
    (UNREPORTED_USAGE)."""
    bus_id = synth.id_of(synth.stack.alerts.bus)
    publishers = {}
    for name, statements in _function_statements(synth).items():
        for statement in statements:
            if "events:PutEvents" in statement.actions:
                publishers[name] = statement.targets
    assert publishers == {"aggregator": {bus_id}, "usage": {bus_id}, "usage_batch": {bus_id}, "reconciler": {bus_id}}


def test_only_the_reconciler_reads_bedrocks_metrics_and_nothing_else_of_cloudwatch(synth):
    """GetMetricData and ListMetrics (no resource-level permissions: Resource "*"), read-only."""
    readers = {}
    for name, statements in _function_statements(synth).items():
        for statement in statements:
            cloudwatch = [a for a in statement.actions if a.startswith("cloudwatch:")]
            if cloudwatch:
                readers[name] = (set(cloudwatch), statement.wildcard)
    assert readers == {"reconciler": ({"cloudwatch:GetMetricData", "cloudwatch:ListMetrics"}, True)}


def test_only_the_bill_comparison_reads_cost_explorer(synth):
    """GetCostAndUsage only (on "*": it has no other resource), for the optional daily job."""
    readers = {
        name: ({action for action in statement.actions if action.startswith("ce:")}, statement.wildcard)
        for name, statements in _function_statements(synth).items()
        for statement in statements
        if any(action.startswith("ce:") for action in statement.actions)
    }
    assert readers == {"bill": ({"ce:GetCostAndUsage"}, True)}


def _granted_alone(synth, action: str) -> dict[str, list]:
    """The resources of each function's statement granting ``action``, which grants nothing else."""
    granted = {}
    for name, statements in _function_statements(synth).items():
        for statement in statements:
            if action in statement.actions:
                assert statement.actions == (action,), name
                granted[name] = statement.resources
    return granted


def test_only_the_pricing_fetcher_reads_foundation_models(synth):
    """It asks a model's name (GetFoundationModel) to find it in the Price List; foundation
    models are AWS's, so the ARN has no account."""
    readers = _granted_alone(synth, "bedrock:GetFoundationModel")
    assert set(readers) == {"pricing_fetcher"}
    (resource,) = readers["pricing_fetcher"]
    assert resource["Fn::Join"][1][-1] == ":bedrock:*::foundation-model/*"


def test_profile_resolving_functions_read_inference_profiles_of_their_own_account_only(synth):
    """Registration and usage resolve profiles (GetInferenceProfile); a profile of another
    account is AccessDenied, which the service answers as 400 (docs/metering.md)."""
    readers = _granted_alone(synth, "bedrock:GetInferenceProfile")
    assert set(readers) == access.INFERENCE_PROFILE_READERS
    assert {"inference_profiles", "usage", "usage_batch", "model_selection"} <= set(readers)
    for resources in readers.values():
        assert all({"Ref": "AWS::AccountId"} in resource["Fn::Join"][1] for resource in resources), resources


def test_logs_only_to_own_log_group(synth):
    functions = synth.json["Resources"]
    for name, fn_id in synth.function_ids().items():
        own_group = functions[fn_id]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        for statement in _function_statements(synth)[name]:
            if any(a.startswith("logs:") for a in statement.actions):
                assert statement.targets == {own_group}, name
