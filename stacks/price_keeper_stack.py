"""The whole service in one stack: tables, secrets, layers, functions, API, schedules, the
usage stream's trigger, alerts and monitoring."""

from __future__ import annotations

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from price_keeper.config import parse_config, read_raw
from price_keeper.store.tables import USAGE_AGG_SHARDED

from . import access
from .alerts import Alerts
from .api import gateway
from .functions import Functions
from .layer import SharedLayers
from .monitoring import Monitoring
from .schedules import Schedules
from .settings import Settings
from .storage import Tables
from .streams import UsageStreamTrigger


def _generated_secret(scope: Construct, id: str, name: str, description: str, length: int):
    return secretsmanager.Secret(
        scope,
        id,
        secret_name=name,
        description=description,
        generate_secret_string=secretsmanager.SecretStringGenerator(password_length=length, exclude_punctuation=True),
        removal_policy=RemovalPolicy.DESTROY,
    )


class PriceKeeperStack(Stack):
    def __init__(self, scope: Construct, id: str, *, settings: Settings, **kwargs):
        super().__init__(scope, id, description="Bedrock Price Keeper: daily spend quotas for Amazon Bedrock", **kwargs)
        # A broken config.yaml fails the synth, not the first request after the deploy.
        parse_config(read_raw(settings.config_path))
        self.settings = settings

        self.tables = Tables(self, "Tables", settings)
        self.jwt_secret = _generated_secret(
            self,
            "JwtSigningKey",
            f"{settings.secret_prefix}jwt-signing-key",
            "HS256 signing key of the service's access and refresh tokens",
            64,
        )
        self.provisioning_secret = _generated_secret(
            self,
            "ProvisioningApiKey",
            f"{settings.secret_prefix}provisioning-api-key",
            "X-API-Key of the provisioning endpoints (orgs, apps, rotation, quota boosts)",
            48,
        )
        self.layers = SharedLayers(self, "Layers", settings)
        self.alerts = Alerts(self, "Alerts", settings=settings)
        self.functions = Functions(
            self,
            "Functions",
            settings=settings,
            tables=self.tables,
            layers=self.layers,
            jwt_secret=self.jwt_secret,
            provisioning_secret=self.provisioning_secret,
            extra_environment={
                name: {"EVENT_BUS_NAME": self.alerts.bus.event_bus_name} for name in access.ALERT_PUBLISHERS
            },
        )
        for name in access.ALERT_PUBLISHERS:
            self.alerts.bus.grant_put_events_to(self.functions.by_name[name].role)
        self.alerts.look_up_unpriced_models_with(self.functions.by_name["pricing_fetcher"])
        self.api = gateway(self, "Http", settings=settings, functions=self.functions.by_name)
        self.schedules = Schedules(self, "Schedules", settings=settings, functions=self.functions.by_name)
        self.usage_stream = UsageStreamTrigger(
            self,
            "UsageStream",
            table=self.tables.by_spec[USAGE_AGG_SHARDED],
            aggregator=self.functions.by_name["aggregator"],
            dead_letter_queue=self.schedules.dead_letter_queues["aggregator"],
            prefix=settings.prefix,
        )
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            settings=settings,
            api=self.api.api,
            functions=self.functions.by_name,
            tables={spec: self.tables.by_spec[spec] for spec in access.touched_tables()},
            dead_letter_queues=self.schedules.dead_letter_queues,
            topic=self.alerts.topic,
        )

        CfnOutput(self, "ApiUrl", value=self.api.url, description="Base URL of the API")
        for spec, table in self.tables.by_spec.items():
            CfnOutput(
                self,
                f"{spec.env.title().replace('_', '')}Name",
                value=table.table_name,
                description=f"Physical name of the {spec.name} table",
            )
        CfnOutput(self, "JwtSecretArn", value=self.jwt_secret.secret_arn)
        CfnOutput(
            self,
            "ProvisioningSecretArn",
            value=self.provisioning_secret.secret_arn,
            description="aws secretsmanager get-secret-value --secret-id <this> gives the X-API-Key",
        )
        CfnOutput(self, "AlertTopicArn", value=self.alerts.topic.topic_arn)
        CfnOutput(self, "EventBusName", value=self.alerts.bus.event_bus_name)
        CfnOutput(self, "DashboardName", value=self.monitoring.dashboard.dashboard_name)
