"""Alarms, the dashboard and the stack outputs."""
from __future__ import annotations

import json

import pytest

from price_keeper.tables import ALL_TABLES
from stacks.functions import FUNCTIONS

from .cfn import logical_id, referenced_ids

pytestmark = pytest.mark.infra


def _alarms(synth) -> dict[str, dict]:
    return {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()}


def test_every_alarm_notifies_the_alert_topic(synth):
    topic_id = synth.id_of(synth.stack.alerts.topic)
    for name, alarm in _alarms(synth).items():
        assert [logical_id(a) for a in alarm["AlarmActions"]] == [topic_id], name


def test_api_5xx_rate_alarm(synth):
    alarm = _alarms(synth)["price-keeper-dev-api-5xx-rate"]
    assert alarm["Threshold"] == 5 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert "100 * errors / requests" in expression["Expression"]
    metric_names = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert metric_names == {"5XXError", "Count"}


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


def test_dashboard_shows_api_lambda_custom_metrics_and_queues(synth):
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for needle in ("Count", "4XXError", "5XXError", "Latency", "p50", "p99", "Errors", "Throttles",
                   "AggregatorLagSeconds", "SpendPct", "ApproximateNumberOfMessagesVisible"):
        assert needle in body, needle


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
    secrets = {s["Properties"]["Name"]: s["Properties"]
               for s in synth.resources("AWS::SecretsManager::Secret").values()}
    assert set(secrets) == {"price-keeper/dev/jwt-signing-key", "price-keeper/dev/provisioning-api-key"}
    for secret in secrets.values():
        assert "GenerateSecretString" in secret and "SecretString" not in secret
