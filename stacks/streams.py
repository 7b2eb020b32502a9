"""The aggregator's event-driven trigger: an event source mapping on the usage table's
stream, as ``price_keeper.domain.aggregation.USAGE_STREAM`` and ``USAGE_STREAM_FILTER`` define it.

Batches of shard writes reach the aggregator within the batching window (1 s). A batch
that fails is split in two and retried (bisect on error) up to ``retries`` times or until
its records are ``max_record_age_s`` old; then its description goes to the aggregator's
dead-letter queue (the same queue as failed scheduled runs, so one alarm covers both) and
the sweep folds what it named. ``parallelization_factor`` batches at once per stream shard:
the fold stays exact, since it recomputes from the shards and moves totals only by
conditional transactions (docs/infrastructure.md, "Concurrency").
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from price_keeper.domain.aggregation import USAGE_STREAM, USAGE_STREAM_FILTER


class UsageStreamTrigger(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        table: dynamodb.Table,
        aggregator: lambda_.Function,
        dead_letter_queue: sqs.IQueue,
    ):
        super().__init__(scope, id)
        self.source = sources.DynamoEventSource(
            table,
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=USAGE_STREAM.batch_size,
            max_batching_window=Duration.seconds(USAGE_STREAM.batching_window_s),
            bisect_batch_on_error=True,
            retry_attempts=USAGE_STREAM.retries,
            max_record_age=Duration.seconds(USAGE_STREAM.max_record_age_s),
            on_failure=sources.SqsDlq(dead_letter_queue),
            parallelization_factor=USAGE_STREAM.parallelization_factor,
            filters=[lambda_.FilterCriteria.filter(USAGE_STREAM_FILTER)],
        )
        aggregator.add_event_source(self.source)
