"""Spend alerts: the service's event bus, a rule routing alert events to an SNS topic, and
the optional e-mail subscription. CloudWatch alarms notify the same topic."""
from __future__ import annotations

from aws_cdk import aws_events as events, aws_events_targets as targets, aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from .settings import ALERT_EVENT_SOURCE, Settings


class Alerts(Construct):
    def __init__(self, scope: Construct, id: str, *, settings: Settings):
        super().__init__(scope, id)
        self.bus = events.EventBus(self, "Bus", event_bus_name=f"{settings.prefix}events")
        self.topic = sns.Topic(self, "Topic", topic_name=f"{settings.prefix}alerts",
                               display_name="Bedrock Price Keeper alerts", enforce_ssl=True)
        if settings.alert_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(settings.alert_email))
        self.rule = events.Rule(
            self, "ToTopic",
            event_bus=self.bus,
            description="Spend alerts (THRESHOLD, FALLBACK, ALL_EXHAUSTED) to the alert topic",
            event_pattern=events.EventPattern(source=[ALERT_EVENT_SOURCE]),
            targets=[targets.SnsTopic(self.topic)],
        )
