"""The aggregator's event-driven triggers: an event source mapping on the usage table's
stream, as ``price_keeper.domain.aggregation.USAGE_STREAM`` and ``USAGE_STREAM_FILTERS`` define it,
and one on the repair queue (``price_keeper.domain.repair``).

Batches of usage markers reach the aggregator within the batching
window (1 s), one stream shard's batch at a time, the shard named by a tumbling window. A
batch that fails is delivered again from the first record its reply names until it is
folded (never bisected, never given up: ``price_keeper.domain.ledger``); the iterator age
alarm says when a shard stops moving. The hourly audit's chunks go to the repair queue. A
repair message that keeps failing goes to the aggregator's dead-letter queue (the same
queue as failed scheduled runs, so one alarm covers both).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from price_keeper.domain.aggregation import USAGE_STREAM, USAGE_STREAM_FILTERS

REPAIR_BATCH = 10  # messages per invocation: 10 audit chunks of 100 label-days
REPAIR_MAX_CONCURRENCY = 50  # half the aggregator's reserved concurrency: the stream keeps the rest
REPAIR_RECEIVES = 5  # deliveries of a repair message before it goes to the dead-letter queue


class UsageStreamTrigger(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        table: dynamodb.Table,
        aggregator: lambda_.Function,
        dead_letter_queue: sqs.IQueue,
        prefix: str,
    ):
        super().__init__(scope, id)
        self.repair_queue = sqs.Queue(
            self,
            "RepairQueue",
            queue_name=f"{prefix}aggregator-repair",
            # six times the function's timeout (Lambda's advice), so a message is not
            # delivered again while a run still folds it
            visibility_timeout=Duration.seconds(6 * aggregator.timeout.to_seconds()),
            retention_period=Duration.days(4),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(queue=dead_letter_queue, max_receive_count=REPAIR_RECEIVES),
        )
        aggregator.add_environment("REPAIR_QUEUE_URL", self.repair_queue.queue_url)
        self.repair_queue.grant_send_messages(aggregator)  # the audit's plan
        aggregator.add_event_source(
            sources.SqsEventSource(
                self.repair_queue,
                batch_size=REPAIR_BATCH,
                max_concurrency=REPAIR_MAX_CONCURRENCY,
                report_batch_item_failures=True,  # a failed message comes back alone, not its batch
            )
        )
        self.source = sources.DynamoEventSource(
            table,
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=USAGE_STREAM.batch_size,
            max_batching_window=Duration.seconds(USAGE_STREAM.batching_window_s),
            bisect_batch_on_error=False,
            report_batch_item_failures=True,  # resume at the first record of what failed
            # no retry_attempts or max_record_age: retried until folded (-1, the default)
            tumbling_window=Duration.seconds(USAGE_STREAM.tumbling_window_s),
            parallelization_factor=1,
            filters=[lambda_.FilterCriteria.filter(pattern) for pattern in USAGE_STREAM_FILTERS],
        )
        aggregator.add_event_source(self.source)
