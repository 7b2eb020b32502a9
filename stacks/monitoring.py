"""The CloudWatch dashboard and alarms; every alarm notifies the alert topic.

The custom metrics plotted here are the ones the functions publish (``price_keeper.metric_names``);
everything else is AWS's own metrics, which cost nothing to plot.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from price_keeper.metric_names import (
    AGGREGATOR_LAG_SECONDS,
    CLIENT_TOKENS_REVOKED,
    SPEND_PCT,
    STICKY_FLIPS,
    TOKENS_REVOKED,
)
from price_keeper.store.tables import REVOKED_TOKENS, TableSpec

from .settings import METRICS_NAMESPACE, SERVICE_NAME, Settings

FIVE_MINUTES = Duration.minutes(5)
API_5XX_RATE_PCT = 5
AGGREGATOR_LAG_LIMIT_S = 120
# The usage stream's oldest record the aggregator has not taken yet (Lambda's IteratorAge, ms):
# spend is meant to reach the totals within seconds.
ITERATOR_AGE_LIMIT_MS = 30_000


ONE_MINUTE = Duration.minutes(1)


def custom_metric(name: str, statistic: str = "Maximum", period: Duration = ONE_MINUTE) -> cloudwatch.Metric:
    """A metric the functions publish with Powertools (EMF), whose only dimension is ``service``."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": SERVICE_NAME},
        statistic=statistic,
        period=period,
    )


def throttle_events(table: dynamodb.ITable, spec: TableSpec) -> cloudwatch.MathExpression:
    """Read and write requests DynamoDB throttled on a table and on each of its indexes (an
    index that cannot keep up throttles the table's writes), summed per five minutes.

    DynamoDB publishes these only while something is throttled, and an alarm on an
    ``AWS/DynamoDB`` metric ignores missing data whatever it is told: after a burst it would
    stay in ALARM until the next one. ``FILL(..., 0)`` turns the quiet periods into zeros, so
    the alarm returns to OK.
    """
    ids = spec.name.replace("-", "_")
    targets = [{"TableName": table.table_name}] + [
        {"TableName": table.table_name, "GlobalSecondaryIndexName": index.name} for index in spec.indexes
    ]
    using = {
        f"{kind.lower()}_{ids}_{n}": cloudwatch.Metric(
            namespace="AWS/DynamoDB",
            metric_name=f"{kind}ThrottleEvents",
            dimensions_map=dimensions,
            statistic="Sum",
            period=FIVE_MINUTES,
        )
        for n, dimensions in enumerate(targets)
        for kind in ("Read", "Write")
    }
    return cloudwatch.MathExpression(
        expression=" + ".join(f"FILL({metric_id}, 0)" for metric_id in using),
        using_metrics=using,
        label=spec.name,
        period=FIVE_MINUTES,
    )


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: Settings,
        api: apigw.RestApi | apigwv2.HttpApi,
        functions: dict[str, lambda_.Function],
        tables: dict[TableSpec, dynamodb.ITable],
        dead_letter_queues: dict[str, sqs.Queue],
        topic: sns.ITopic,
    ):
        """``tables``: the tables some function may touch (``access.touched_tables``); a table no
        role can reach cannot be throttled, and its alarm would cost for nothing."""
        super().__init__(scope, id)
        notify = actions.SnsAction(topic)
        self.alarms: list[cloudwatch.Alarm] = []

        def alarm(
            alarm_id: str,
            description: str,
            metric: cloudwatch.IMetric,
            threshold: float = 0,
            evaluation_periods: int = 1,
            **kwargs,
        ) -> None:
            """An alarm on ``metric`` above ``threshold`` (by default: any at all in one period);
            no data is not a breach."""
            created = cloudwatch.Alarm(
                self,
                alarm_id,
                alarm_name=f"{settings.prefix}{alarm_id}",
                alarm_description=description,
                metric=metric,
                threshold=threshold,
                evaluation_periods=evaluation_periods,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                **kwargs,
            )
            created.add_alarm_action(notify)
            created.add_ok_action(notify)
            self.alarms.append(created)

        requests = api.metric_count(period=FIVE_MINUTES, statistic="Sum")
        server_errors = api.metric_server_error(period=FIVE_MINUTES, statistic="Sum")
        alarm(
            "api-5xx-rate",
            description=f"More than {API_5XX_RATE_PCT}% of API requests answered 5xx for 10 minutes",
            metric=cloudwatch.MathExpression(
                expression="IF(requests > 0, 100 * errors / requests, 0)",
                using_metrics={"requests": requests, "errors": server_errors},
                label="5xx %",
                period=FIVE_MINUTES,
            ),
            threshold=API_5XX_RATE_PCT,
            evaluation_periods=2,
        )
        alarm(
            "aggregator-lag",
            description=f"Daily totals more than {AGGREGATOR_LAG_LIMIT_S} s behind the usage records",
            metric=custom_metric(AGGREGATOR_LAG_SECONDS),
            threshold=AGGREGATOR_LAG_LIMIT_S,
            evaluation_periods=3,
            datapoints_to_alarm=2,
        )
        iterator_age = functions["aggregator"].metric("IteratorAge", statistic="Maximum", period=ONE_MINUTE)
        alarm(
            "aggregator-iterator-age",
            description=f"Usage waits more than {ITERATOR_AGE_LIMIT_MS // 1000} s in the stream before "
            "the aggregator folds it (3 of 5 minutes)",
            metric=iterator_age,
            threshold=ITERATOR_AGE_LIMIT_MS,
            evaluation_periods=5,
            datapoints_to_alarm=3,
        )
        for name, function in functions.items():
            alarm(
                f"{name.replace('_', '-')}-throttles",
                description=f"Lambda throttled invocations of {name}",
                metric=function.metric_throttles(period=FIVE_MINUTES, statistic="Sum"),
            )
        for name, queue in dead_letter_queues.items():
            alarm(
                f"{name.replace('_', '-')}-dlq-depth",
                description=f"Runs of {name} were lost: messages in its dead-letter queue",
                metric=queue.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum"),
            )
        throttled = {spec: throttle_events(table, spec) for spec, table in tables.items()}
        for spec, events in throttled.items():
            alarm(
                f"table-{spec.name}-throttles",
                description=f"DynamoDB throttled requests to the {spec.name} table or its indexes",
                metric=events,
            )

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{settings.prefix}dashboard")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="API requests", left=[requests], width=8),
            cloudwatch.GraphWidget(
                title="API 4xx / 5xx",
                width=8,
                left=[
                    api.metric_client_error(period=FIVE_MINUTES, statistic="Sum", label="4xx"),
                    api.metric_server_error(period=FIVE_MINUTES, statistic="Sum", label="5xx"),
                ],
            ),
            cloudwatch.GraphWidget(
                title="API latency",
                width=8,
                left=[api.metric_latency(period=FIVE_MINUTES, statistic=p, label=p) for p in ("p50", "p99")],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Lambda errors",
                width=12,
                left=[f.metric_errors(period=FIVE_MINUTES, statistic="Sum", label=n) for n, f in functions.items()],
            ),
            cloudwatch.GraphWidget(
                title="Lambda throttles",
                width=12,
                left=[f.metric_throttles(period=FIVE_MINUTES, statistic="Sum", label=n) for n, f in functions.items()],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Aggregator lag (s)",
                width=8,
                left=[custom_metric(AGGREGATOR_LAG_SECONDS)],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=AGGREGATOR_LAG_LIMIT_S)],
                right=[iterator_age.with_(label="usage stream iterator age (ms)")],
            ),
            # One value per quota of each scope the aggregator changed: the maximum is the
            # scope closest to being cut off, the median how spent a typical quota is.
            cloudwatch.GraphWidget(
                title="Spend % of daily quota (active scopes)",
                width=8,
                left=[
                    custom_metric(SPEND_PCT, "Maximum", FIVE_MINUTES).with_(label="closest to its quota"),
                    custom_metric(SPEND_PCT, "p50", FIVE_MINUTES).with_(label="median quota"),
                ],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=100, label="quota")],
            ),
            cloudwatch.GraphWidget(
                title="Dead-letter queue depth",
                width=8,
                left=[
                    q.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum", label=n)
                    for n, q in dead_letter_queues.items()
                ],
            ),
        )
        revocation_reads = tables[REVOKED_TOKENS].metric_consumed_read_capacity_units(
            period=FIVE_MINUTES, statistic="Sum"
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Sticky fallbacks and revocations",
                width=8,
                left=[
                    custom_metric(name, "Sum", FIVE_MINUTES).with_(label=name)
                    for name in (STICKY_FLIPS, TOKENS_REVOKED, CLIENT_TOKENS_REVOKED)
                ],
            ),
            # The revocation check caches "not revoked" answers (auth.REVOCATION_CACHE_SECONDS):
            # read units of RevokedTokens per API request show how well, with no metric of our own.
            cloudwatch.GraphWidget(
                title="Revocation check: RevokedTokens read units per request",
                width=8,
                left=[
                    cloudwatch.MathExpression(
                        expression="IF(requests > 0, reads / requests, 0)",
                        using_metrics={"reads": revocation_reads, "requests": requests},
                        label="read units / request",
                        period=FIVE_MINUTES,
                    )
                ],
            ),
            cloudwatch.GraphWidget(title="DynamoDB throttled requests", width=8, left=list(throttled.values())),
        )
