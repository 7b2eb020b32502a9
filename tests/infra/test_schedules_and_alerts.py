"""EventBridge schedules with retries and dead-letter queues, the deploy-time price fetch,
and the alert bus → SNS route."""

from __future__ import annotations

import fnmatch
import json

import pytest

from .cfn import logical_id

pytestmark = pytest.mark.infra


def _scheduled_targets(synth) -> dict[str, dict]:
    """Function logical id → (schedule expression, target) of each scheduled rule."""
    found = {}
    for rule in synth.resources("AWS::Events::Rule").values():
        props = rule["Properties"]
        if "ScheduleExpression" in props:
            (target,) = props["Targets"]
            found[logical_id(target["Arn"])] = (props["ScheduleExpression"], target)
    return found


@pytest.mark.parametrize(
    "job, expression, retries, max_age",
    [
        ("aggregator", "rate(1 hour)", 2, 1800),
        ("pricing_fetcher", "rate(1 day)", 8, 6 * 3600),
        ("reconciler", "rate(1 hour)", 2, 3600),
        ("bill", "rate(1 day)", 8, 6 * 3600),
    ],
)
def test_schedule_with_retry_policy_and_dead_letter_queue(synth, job, expression, retries, max_age):
    function_id = synth.function_ids()[job]
    schedule, target = _scheduled_targets(synth)[function_id]
    assert schedule == expression
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": retries, "MaximumEventAgeInSeconds": max_age}
    queue_id = synth.id_of(synth.stack.schedules.dead_letter_queues[job])
    assert logical_id(target["DeadLetterConfig"]["Arn"]) == queue_id
    # Runs that fail inside Lambda (after its own retries) land in the same queue.
    configs = [
        c["Properties"]
        for c in synth.resources("AWS::Lambda::EventInvokeConfig").values()
        if logical_id(c["Properties"]["FunctionName"]) == function_id
    ]
    assert configs and all(logical_id(c["DestinationConfig"]["OnFailure"]["Destination"]) == queue_id for c in configs)


def test_only_the_jobs_are_scheduled(synth):
    ids = synth.function_ids()
    assert set(_scheduled_targets(synth)) == {
        ids[job] for job in ("aggregator", "pricing_fetcher", "reconciler", "bill")
    }


def test_dead_letter_queues_accept_only_eventbridge_from_their_rule(synth):
    for job, queue in synth.stack.schedules.dead_letter_queues.items():
        queue_id = synth.id_of(queue)
        (policy,) = [
            p["Properties"]
            for p in synth.resources("AWS::SQS::QueuePolicy").values()
            if {logical_id(q) for q in p["Properties"]["Queues"]} == {queue_id}
        ]
        senders = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
        assert [s["Principal"] for s in senders] == [{"Service": "events.amazonaws.com"}]
        rule_id = synth.id_of(synth.stack.schedules.rules[job])
        assert logical_id(senders[0]["Condition"]["ArnEquals"]["aws:SourceArn"]) == rule_id


def test_pricing_fetcher_runs_once_on_deploy(synth):
    (trigger,) = synth.resources("Custom::Trigger").values()
    props = trigger["Properties"]
    assert props["InvocationType"] == "Event"
    version = synth.json["Resources"][logical_id(props["HandlerArn"])]
    assert version["Type"] == "AWS::Lambda::Version"
    assert logical_id(version["Properties"]["FunctionName"]) == synth.function_ids()["pricing_fetcher"]


def _rule(synth, rule) -> dict:
    return synth.json["Resources"][synth.id_of(rule)]["Properties"]


def test_alert_events_route_from_the_bus_to_the_topic(synth):
    bus_id = synth.id_of(synth.stack.alerts.bus)
    topic_id = synth.id_of(synth.stack.alerts.topic)
    (bus,) = synth.resources("AWS::Events::EventBus").values()
    assert bus["Properties"]["Name"] == "price-keeper-dev-events"
    on_bus = [
        r["Properties"] for r in synth.resources("AWS::Events::Rule").values() if "EventBusName" in r["Properties"]
    ]
    assert all(logical_id(rule["EventBusName"]) == bus_id for rule in on_bus) and len(on_bus) == 2
    rule = _rule(synth, synth.stack.alerts.rule)
    assert rule["EventPattern"] == {"source": ["price-keeper"]}
    assert [logical_id(t["Arn"]) for t in rule["Targets"]] == [topic_id]  # no webhook unless configured
    assert not synth.resources("AWS::Events::ApiDestination")


def test_unpriced_model_events_run_the_pricing_fetcher(synth):
    rule = _rule(synth, synth.stack.alerts.unpriced_model_rule)
    assert rule["EventPattern"] == {
        "source": ["price-keeper"],
        "detail-type": ["SpendAlert"],
        "detail": {"type": ["UNPRICED_MODEL"]},
    }
    (target,) = rule["Targets"]
    assert logical_id(target["Arn"]) == synth.function_ids()["pricing_fetcher"]
    assert "Input" not in target and "InputTransformer" not in target  # the whole event: detail names the model
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 8, "MaximumEventAgeInSeconds": 6 * 3600}
    rule_id = synth.id_of(synth.stack.alerts.unpriced_model_rule)
    permissions = [
        p["Properties"]
        for p in synth.resources("AWS::Lambda::Permission").values()
        if logical_id(p["Properties"].get("SourceArn", "")) == rule_id
    ]
    assert [(p["Principal"], logical_id(p["FunctionName"])) for p in permissions] == [
        ("events.amazonaws.com", synth.function_ids()["pricing_fetcher"])
    ]


def test_a_configured_webhook_gets_each_alert_as_slack_json(synth_options):
    ((destination_id, destination),) = synth_options.resources("AWS::Events::ApiDestination").items()
    destination = destination["Properties"]
    assert destination["InvocationEndpoint"] == "https://hooks.slack.com/services/T000/B000/XXXXXXXX"
    assert destination["HttpMethod"] == "POST"
    ((connection_id, connection),) = synth_options.resources("AWS::Events::Connection").items()
    assert logical_id(destination["ConnectionArn"]) == connection_id
    assert connection["Properties"]["AuthorizationType"] == "API_KEY"
    rule = _rule(synth_options, synth_options.stack.alerts.rule)
    topic_id = synth_options.id_of(synth_options.stack.alerts.topic)
    topic_target, webhook_target = rule["Targets"]
    assert logical_id(topic_target["Arn"]) == topic_id and "InputTransformer" not in topic_target
    assert logical_id(webhook_target["Arn"]) == destination_id
    assert logical_id(webhook_target["RoleArn"])  # EventBridge invokes the destination with its own role
    transformer = webhook_target["InputTransformer"]
    paths = transformer["InputPathsMap"]
    assert set(paths.values()) >= {"$.detail.type", "$.detail.label", "$.detail.model_id", "$.detail.scope"}
    # the template is Slack's {"text": ...} once EventBridge fills each placeholder in (here: the field's name)
    text = transformer["InputTemplate"]
    for placeholder, path in paths.items():
        text = text.replace(f"<{placeholder}>", path.removeprefix("$.detail."))
    assert json.loads(text) == {
        "text": "Bedrock Price Keeper type: label label, threshold threshold_pct%, "
        "model model_id; spend spend_usd_micros of quota_usd_micros micro-USD "
        "on date in scope"
    }


def test_the_webhook_must_be_https():
    from stacks.settings import Settings

    class Node:
        def try_get_context(self, key):
            return {"alertWebhookUrl": "http://hooks.example/alert"}.get(key)

    with pytest.raises(ValueError, match="https"):
        Settings.from_context(Node())


def test_no_email_subscription_unless_configured(synth, synth_options):
    assert not synth.resources("AWS::SNS::Subscription")
    (subscription,) = synth_options.resources("AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"


def test_aggregator_knows_the_bus(synth):
    env = synth.json["Resources"][synth.function_ids()["aggregator"]]["Properties"]["Environment"]["Variables"]
    assert logical_id(env["EVENT_BUS_NAME"]) == synth.id_of(synth.stack.alerts.bus)


def _resolve(value, stack_values: dict) -> str:
    """A ``Fn::Join`` of literals and pseudo parameters, as CloudFormation renders it."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return stack_values[value["Ref"]]
    separator, parts = value["Fn::Join"]
    return separator.join(_resolve(part, stack_values) for part in parts)


def test_cloudwatch_may_publish_this_stacks_alarms_to_the_topic(synth):
    """The topic policy CDK writes for the EventBridge rule replaces SNS's default one: without
    a statement for CloudWatch, every alarm action fails ("not authorized to perform SNS:Publish")."""
    topic_id = synth.id_of(synth.stack.alerts.topic)
    (policy,) = [
        p["Properties"]
        for p in synth.resources("AWS::SNS::TopicPolicy").values()
        if [logical_id(t) for t in p["Properties"]["Topics"]] == [topic_id]
    ]
    statements = [
        s
        for s in policy["PolicyDocument"]["Statement"]
        if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
    ]
    (statement,) = statements
    assert statement["Effect"] == "Allow" and statement["Action"] == "sns:Publish"
    assert logical_id(statement["Resource"]) == topic_id
    pseudo = {"AWS::Partition": "aws", "AWS::Region": "eu-west-1", "AWS::AccountId": "123456789012"}
    source = _resolve(statement["Condition"]["ArnLike"]["aws:SourceArn"], pseudo)
    assert source == "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:price-keeper-dev-*"
    assert _resolve(statement["Condition"]["StringEquals"]["aws:SourceAccount"], pseudo) == "123456789012"
    alarms = [a["Properties"]["AlarmName"] for a in synth.resources("AWS::CloudWatch::Alarm").values()]
    arn = "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:{}".format
    assert alarms and all(fnmatch.fnmatchcase(arn(name), source) for name in alarms)
