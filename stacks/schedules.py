"""EventBridge schedules of the jobs (aggregator sweep, pricing fetcher, reconciler, bill),
their dead-letter queues, and the pricing fetch that runs once when the stack is deployed."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Annotations, Duration, triggers
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from .settings import Settings

# Lambda's own retries of a failed asynchronous invocation (its maximum).
ASYNC_RETRIES = 2


@dataclass(frozen=True)
class Schedule:
    function: str
    rate: Duration
    retries: int
    max_event_age: Duration


# The aggregator's schedule plans its hourly audit (the usage stream keeps totals fresh, and
# batches it gave up on are refolded from the repair queue): a missed audit is made good by
# the next one, so its events are not worth keeping long; a missed daily price fetch is
# worth retrying for hours.
SCHEDULES = (
    Schedule("aggregator", Duration.hours(1), retries=2, max_event_age=Duration.minutes(30)),
    Schedule("pricing_fetcher", Duration.days(1), retries=8, max_event_age=Duration.hours(6)),
    # Bedrock's counts against the metered ones (a missed run is caught up by the next: each
    # run recomputes the whole UTC day).
    Schedule("reconciler", Duration.hours(1), retries=2, max_event_age=Duration.hours(1)),
    # The optional bill comparison (a no-op unless config.yaml sets reconciliation.bill_tag_key).
    Schedule("bill", Duration.days(1), retries=8, max_event_age=Duration.hours(6)),
)


class Schedules(Construct):
    """``self.rules[name]``, ``self.dead_letter_queues[name]`` per scheduled function.

    Each job's queue receives both the events EventBridge could not deliver (target DLQ)
    and the asynchronous invocations that still failed after Lambda's retries (on-failure
    destination), so one alarm on its depth covers every way a run can be lost.
    """

    def __init__(self, scope: Construct, id: str, *, settings: Settings, functions: dict[str, lambda_.Function]):
        super().__init__(scope, id)
        self.rules: dict[str, events.Rule] = {}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        for schedule in SCHEDULES:
            function = functions[schedule.function]
            name = schedule.function.replace("_", "-")
            queue = sqs.Queue(
                self,
                f"{name}-dlq",
                queue_name=f"{settings.prefix}{name}-dlq",
                retention_period=Duration.days(14),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
            )
            function.configure_async_invoke(
                retry_attempts=ASYNC_RETRIES,
                max_event_age=schedule.max_event_age,
                on_failure=destinations.SqsDestination(queue),
            )
            self.rules[schedule.function] = events.Rule(
                self,
                f"{name}-schedule",
                rule_name=f"{settings.prefix}{name}",
                description=f"Runs {schedule.function} every {schedule.rate.to_human_string()}",
                schedule=events.Schedule.rate(schedule.rate),
                targets=[
                    targets.LambdaFunction(
                        function,
                        dead_letter_queue=queue,
                        retry_attempts=schedule.retries,
                        max_event_age=schedule.max_event_age,
                    )
                ],
            )
            self.dead_letter_queues[schedule.function] = queue
            if schedule.function == "pricing_fetcher":
                self._fetch_on_deploy(function, schedule, queue)

    def _fetch_on_deploy(self, fetcher: lambda_.Function, schedule: Schedule, queue: sqs.Queue) -> None:
        """Prices on the first deploy (and whenever the fetcher changes) instead of a day later.

        The trigger invokes the function's current version asynchronously, so a slow Price
        List API never fails a deploy; that version's failures go to the same queue.
        """
        fetcher.current_version.configure_async_invoke(
            retry_attempts=ASYNC_RETRIES,
            max_event_age=schedule.max_event_age,
            on_failure=destinations.SqsDestination(queue),
        )
        triggers.Trigger(
            self,
            "FetchPricesOnDeploy",
            handler=fetcher,
            invocation_type=triggers.InvocationType.EVENT,
            execute_on_handler_change=True,
        )
        Annotations.of(fetcher).acknowledge_warning(
            "@aws-cdk/aws-lambda:addPermissionsToVersionOrAlias",
            "only EventBridge invokes through a resource policy (unqualified); the trigger's role may invoke versions",
        )
