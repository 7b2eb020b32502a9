"""EventBridge schedules with retries and dead-letter queues, the deploy-time price fetch,
and the alert bus → SNS route."""
from __future__ import annotations

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


@pytest.mark.parametrize("job, expression, retries, max_age", [
    ("aggregator", "rate(1 minute)", 2, 120),
    ("pricing_fetcher", "rate(1 day)", 8, 6 * 3600),
])
def test_schedule_with_retry_policy_and_dead_letter_queue(synth, job, expression, retries, max_age):
    function_id = synth.function_ids()[job]
    schedule, target = _scheduled_targets(synth)[function_id]
    assert schedule == expression
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": retries, "MaximumEventAgeInSeconds": max_age}
    queue_id = synth.id_of(synth.stack.schedules.dead_letter_queues[job])
    assert logical_id(target["DeadLetterConfig"]["Arn"]) == queue_id
    # Runs that fail inside Lambda (after its own retries) land in the same queue.
    configs = [c["Properties"] for c in synth.resources("AWS::Lambda::EventInvokeConfig").values()
               if logical_id(c["Properties"]["FunctionName"]) == function_id]
    assert configs and all(logical_id(c["DestinationConfig"]["OnFailure"]["Destination"]) == queue_id
                           for c in configs)


def test_only_the_jobs_are_scheduled(synth):
    ids = synth.function_ids()
    assert set(_scheduled_targets(synth)) == {ids["aggregator"], ids["pricing_fetcher"]}


def test_dead_letter_queues_accept_only_eventbridge_from_their_rule(synth):
    for job, queue in synth.stack.schedules.dead_letter_queues.items():
        queue_id = synth.id_of(queue)
        (policy,) = [p["Properties"] for p in synth.resources("AWS::SQS::QueuePolicy").values()
                     if {logical_id(q) for q in p["Properties"]["Queues"]} == {queue_id}]
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


def test_alert_events_route_from_the_bus_to_the_topic(synth):
    bus_id = synth.id_of(synth.stack.alerts.bus)
    topic_id = synth.id_of(synth.stack.alerts.topic)
    (bus,) = synth.resources("AWS::Events::EventBus").values()
    assert bus["Properties"]["Name"] == "price-keeper-dev-events"
    (rule,) = [r["Properties"] for r in synth.resources("AWS::Events::Rule").values()
               if "EventBusName" in r["Properties"]]
    assert logical_id(rule["EventBusName"]) == bus_id
    assert rule["EventPattern"] == {"source": ["price-keeper"]}
    assert [logical_id(t["Arn"]) for t in rule["Targets"]] == [topic_id]


def test_no_email_subscription_unless_configured(synth, synth_options):
    assert not synth.resources("AWS::SNS::Subscription")
    (subscription,) = synth_options.resources("AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"


def test_aggregator_knows_the_bus(synth):
    env = synth.json["Resources"][synth.function_ids()["aggregator"]]["Properties"]["Environment"]["Variables"]
    assert logical_id(env["EVENT_BUS_NAME"]) == synth.id_of(synth.stack.alerts.bus)
