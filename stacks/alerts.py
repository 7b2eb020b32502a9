"""Spend alerts: the service's event bus, a rule routing alert events to an SNS topic (with
the optional e-mail subscription) and, when configured, to a chat webhook (an EventBridge
API destination posting Slack-compatible JSON). CloudWatch alarms notify the same topic.
``UNPRICED_MODEL`` events also run the pricing fetcher for the model they name."""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Duration, SecretValue, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from .settings import ALERT_EVENT_SOURCE, Settings

ALERT_DETAIL_TYPE = "SpendAlert"
UNPRICED_MODEL = "UNPRICED_MODEL"


def _field(name: str) -> str:
    return events.EventField.from_path(f"$.detail.{name}")


def chat_message() -> events.RuleTargetInput:
    """The alert as a Slack-compatible ``{"text": ...}`` body (an input transformer: fields
    an alert does not have read ``null``)."""
    return events.RuleTargetInput.from_object(
        {
            "text": (
                f"Bedrock Price Keeper {_field('type')}: label {_field('label')}, "
                f"threshold {_field('threshold_pct')}%, model {_field('model_id')}; "
                f"spend {_field('spend_usd_micros')} of {_field('quota_usd_micros')} micro-USD "
                f"on {_field('date')} in {_field('scope')}"
            )
        }
    )


class Alerts(Construct):
    def __init__(self, scope: Construct, id: str, *, settings: Settings):
        super().__init__(scope, id)
        self.bus = events.EventBus(self, "Bus", event_bus_name=f"{settings.prefix}events")
        self.topic = sns.Topic(
            self,
            "Topic",
            topic_name=f"{settings.prefix}alerts",
            display_name="Bedrock Price Keeper alerts",
            enforce_ssl=True,
        )
        # A topic policy replaces SNS's default one: without this statement no alarm of the
        # stack could publish (alarms are named <prefix><alarm>, monitoring.py).
        alarms = Stack.of(self).format_arn(
            service="cloudwatch",
            resource="alarm",
            resource_name=f"{settings.prefix}*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "ArnLike": {"aws:SourceArn": alarms},
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                },
            )
        )
        if settings.alert_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(settings.alert_email))
        self.webhook: events.ApiDestination | None = None
        # Published with a role of its own, which only this rule may use: the topic policy
        # CDK writes otherwise lets EventBridge publish for any rule, of any account.
        notify: list[events.IRuleTarget] = [targets.SnsTopic(self.topic, authorize_using_role=True)]
        if settings.alert_webhook_url:
            self.webhook = self._webhook(settings)
            notify.append(
                targets.ApiDestination(
                    self.webhook, event=chat_message(), retry_attempts=8, max_event_age=Duration.hours(6)
                )
            )
        self.rule = events.Rule(
            self,
            "ToTopic",
            event_bus=self.bus,
            description=f"Spend alerts (THRESHOLD, FALLBACK, ALL_EXHAUSTED, {UNPRICED_MODEL}) to the alert topic"
            + (" and the webhook" if self.webhook else ""),
            event_pattern=events.EventPattern(source=[ALERT_EVENT_SOURCE]),
            targets=notify,
        )
        self.unpriced_model_rule: events.Rule | None = None

    def _webhook(self, settings: Settings) -> events.ApiDestination:
        # A chat webhook URL carries its own secret; the connection's API key header is
        # only there because EventBridge requires an authorization.
        connection = events.Connection(
            self,
            "WebhookConnection",
            description="Alert webhook (the URL authorizes the call)",
            authorization=events.Authorization.api_key(
                "X-Price-Keeper-Alert", SecretValue.unsafe_plain_text("webhook")
            ),
        )
        return events.ApiDestination(
            self,
            "Webhook",
            connection=connection,
            endpoint=settings.alert_webhook_url,
            http_method=events.HttpMethod.POST,
            rate_limit_per_second=1,
            description="Spend alerts as Slack-compatible JSON",
        )

    def look_up_unpriced_models_with(self, fetcher: lambda_.IFunction) -> None:
        """First sight of a model outside config.yaml: its ``UNPRICED_MODEL`` event runs the
        pricing fetcher for that model at once (the daily run keeps it priced afterwards)."""
        self.unpriced_model_rule = events.Rule(
            self,
            "UnpricedModelToFetcher",
            event_bus=self.bus,
            description="Looks up the Price List prices of a model first counted at the estimate",
            event_pattern=events.EventPattern(
                source=[ALERT_EVENT_SOURCE], detail_type=[ALERT_DETAIL_TYPE], detail={"type": [UNPRICED_MODEL]}
            ),
            targets=[targets.LambdaFunction(fetcher, retry_attempts=8, max_event_age=Duration.hours(6))],
        )
