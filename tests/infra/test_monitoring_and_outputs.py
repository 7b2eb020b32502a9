"""Alarms, the dashboard and the stack outputs."""

from __future__ import annotations

import json
import re

import pytest

from price_keeper import metric_names
from price_keeper.store.tables import ALL_TABLES, SECRET_RETRIEVAL_TOKENS
from stacks import LAMBDAS_DIR, LAYER_SOURCE, access
from stacks.functions import FUNCTIONS

from .cfn import logical_id, referenced_ids

pytestmark = pytest.mark.infra


def _alarms(synth) -> dict[str, dict]:
    return {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()}


def test_every_alarm_notifies_the_alert_topic(synth):
    topic_id = synth.id_of(synth.stack.alerts.topic)
    for name, alarm in _alarms(synth).items():
        assert [logical_id(a) for a in alarm["AlarmActions"]] == [topic_id], name


# The gateway's error metrics by ``apiKind``: (4xx, 5xx) of an HTTP API and of a REST API.
ERROR_METRICS = {"http": ("4xx", "5xx"), "rest": ("4XXError", "5XXError")}


@pytest.mark.parametrize("kind", ERROR_METRICS)
def test_api_5xx_rate_alarm(synth, synth_rest, kind):
    alarm = _alarms(synth if kind == "http" else synth_rest)["price-keeper-dev-api-5xx-rate"]
    assert alarm["Threshold"] == 5 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert "100 * errors / requests" in expression["Expression"]
    metric_names = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert metric_names == {ERROR_METRICS[kind][1], "Count"}


def test_aggregator_lag_alarm(synth):
    alarm = _alarms(synth)["price-keeper-dev-aggregator-lag"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("BedrockPriceKeeper", "AggregatorLagSeconds")
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "price-keeper"}]
    assert alarm["Threshold"] == 120 and alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_throttle_alarm_per_function(synth):
    alarms = _alarms(synth)
    function_ids = synth.function_ids()
    for name in FUNCTIONS:
        alarm = alarms[f"price-keeper-dev-{name.replace('_', '-')}-throttles"]
        assert alarm["MetricName"] == "Throttles" and alarm["Threshold"] == 0
        assert referenced_ids(alarm["Dimensions"]) == {function_ids[name]}


def test_dead_letter_queue_depth_alarms(synth):
    alarms = _alarms(synth)
    for job, queue in synth.stack.schedules.dead_letter_queues.items():
        alarm = alarms[f"price-keeper-dev-{job.replace('_', '-')}-dlq-depth"]
        assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert alarm["Threshold"] == 0 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
        assert referenced_ids(alarm["Dimensions"]) == {synth.id_of(queue)}


def test_table_throttle_alarm_per_table_a_function_may_touch(synth):
    alarms = _alarms(synth)
    table_ids = synth.table_ids()
    assert access.touched_tables() == [spec for spec in ALL_TABLES if spec is not SECRET_RETRIEVAL_TOKENS]
    assert not any(SECRET_RETRIEVAL_TOKENS.name in name for name in alarms)  # unused: nothing to throttle
    for spec in access.touched_tables():
        alarm = alarms[f"price-keeper-dev-table-{spec.name}-throttles"]
        assert alarm["Threshold"] == 0 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
        (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
        stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
        # every series counts, and a quiet one counts as zero (see monitoring.throttle_events)
        assert expression["Expression"] == " + ".join(f"FILL({metric_id}, 0)" for metric_id in stats)
        watched = {
            (
                stat["Metric"]["MetricName"],
                frozenset(
                    (d["Name"], logical_id(d["Value"]) if d["Name"] == "TableName" else d["Value"])
                    for d in stat["Metric"]["Dimensions"]
                ),
            )
            for stat in stats.values()
        }
        targets = [frozenset({("TableName", table_ids[spec])})] + [
            frozenset({("TableName", table_ids[spec]), ("GlobalSecondaryIndexName", index.name)})
            for index in spec.indexes
        ]
        assert watched == {(f"{kind}ThrottleEvents", target) for kind in ("Read", "Write") for target in targets}
        assert all(stat["Stat"] == "Sum" and stat["Metric"]["Namespace"] == "AWS/DynamoDB" for stat in stats.values())


def _dashboard(synth) -> dict:
    """The dashboard body as CloudWatch reads it (references to resources filled in with ``REF``)."""
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    return json.loads("".join(part if isinstance(part, str) else "REF" for part in parts))


def test_dashboard_shows_api_lambda_tables_custom_metrics_and_queues(synth):
    body = json.dumps(_dashboard(synth))
    for needle in (
        "Count",
        *ERROR_METRICS["http"],
        "Latency",
        "p50",
        "p99",
        "Errors",
        "Throttles",
        "ApproximateNumberOfMessagesVisible",
        "ReadThrottleEvents",
        "WriteThrottleEvents",
        "ConsumedReadCapacityUnits",
    ):
        assert needle in body, needle


def _published_by_the_code() -> set[str]:
    """Custom metrics some function adds: a ``metric_names`` constant passed to
    ``observability.count`` or to ``metrics.add_metric(name=...)`` in the layer or a handler."""
    names = {constant: value for constant, value in vars(metric_names).items() if constant.isupper()}
    sources = [path for root in (LAYER_SOURCE / "price_keeper", LAMBDAS_DIR) for path in root.rglob("*.py")]
    code = "\n".join(path.read_text() for path in sources if path.name != "metric_names.py")
    return {value for constant, value in names.items() if re.search(rf"(\bcount\(|\bname=){constant}\b", code)}


def test_every_custom_metric_the_dashboard_and_alarms_show_is_published(synth):
    """Only one dimension (service): a metric per tenant would be billed per tenant."""
    plotted = [
        series
        for widget in _dashboard(synth)["widgets"]
        for series in widget["properties"].get("metrics", [])
        if series[0] == "BedrockPriceKeeper"
    ]
    assert all(series[2:4] == ["service", "price-keeper"] and isinstance(series[4], dict) for series in plotted)
    alarmed = [a for a in _alarms(synth).values() if a.get("Namespace") == "BedrockPriceKeeper"]
    assert all(a["Dimensions"] == [{"Name": "service", "Value": "price-keeper"}] for a in alarmed)
    shown = {series[1] for series in plotted} | {a["MetricName"] for a in alarmed}
    assert shown == {
        metric_names.AGGREGATOR_LAG_SECONDS,
        metric_names.SPEND_PCT,
        metric_names.STICKY_FLIPS,
        metric_names.TOKENS_REVOKED,
        metric_names.CLIENT_TOKENS_REVOKED,
    }
    assert shown <= _published_by_the_code()


def test_outputs(synth):
    outputs = synth.json["Outputs"]
    assert "ApiUrl" in outputs
    table_ids = synth.table_ids()
    table_outputs = {logical_id(o["Value"]) for o in outputs.values()} & set(table_ids.values())
    assert table_outputs == {table_ids[spec] for spec in ALL_TABLES}
    assert logical_id(outputs["JwtSecretArn"]["Value"]) == synth.id_of(synth.stack.jwt_secret)
    assert logical_id(outputs["ProvisioningSecretArn"]["Value"]) == synth.id_of(synth.stack.provisioning_secret)
    assert logical_id(outputs["AlertTopicArn"]["Value"]) == synth.id_of(synth.stack.alerts.topic)


def test_secrets_are_generated_with_stage_names(synth):
    secrets = {
        s["Properties"]["Name"]: s["Properties"] for s in synth.resources("AWS::SecretsManager::Secret").values()
    }
    assert set(secrets) == {"price-keeper/dev/jwt-signing-key", "price-keeper/dev/provisioning-api-key"}
    for secret in secrets.values():
        assert "GenerateSecretString" in secret and "SecretString" not in secret
