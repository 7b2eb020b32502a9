"""The usage table's DynamoDB Stream, delivered to the aggregator as Lambda's event source
mapping delivers it (``price_keeper.domain.aggregation.USAGE_STREAM``): the local server polls the
stream (moto's, or DynamoDB Local's) from a thread and invokes the same aggregator handler
with Lambda-shaped batches, so ``make run`` folds usage within seconds as AWS does.

Like the mapping: reading starts at ``TRIM_HORIZON`` (after a restart, the replayed journal's
writes are folded again, which changes nothing), a batch is sent when ``batch_size`` records
wait or the first has waited ``batching_window_s``, a batch whose reply names a failed
record (``batchItemFailures``) is delivered again from that record on, and a batch that
keeps failing is given up after ``retries`` attempts: its description goes to the repair queue, as the
mapping's on-failure destination sends it. ``RepairTrigger`` delivers that queue (moto's
SQS) to the aggregator as the queue's mapping does: the same fan-out code as deployed
(``price_keeper.domain.repair``), the audit's chunks included.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime

import boto3
from botocore.config import Config

from price_keeper.domain.aggregation import USAGE_STREAM
from price_keeper.store.tables import TableSpec

from .gateway import invoke_job

log = logging.getLogger("price_keeper.local")
POLL_SECONDS = 0.2


def lambda_event(records: list[dict]) -> dict:
    return {"Records": records}


class StreamReader:
    """The records a table's stream gained since the last ``read()``, shard by shard, each in
    the shape Lambda hands a function (``ApproximateCreationDateTime`` in epoch seconds,
    ``eventSourceARN``)."""

    def __init__(self, spec: TableSpec):
        endpoint = os.environ.get("DYNAMODB_ENDPOINT_URL") or None
        self.arn = boto3.client("dynamodb", endpoint_url=endpoint).describe_table(TableName=spec.physical_name)[
            "Table"
        ]["LatestStreamArn"]
        # The regional endpoint, not the account-based one botocore derives from the stream ARN
        # (moto serves only the former).
        self.streams = boto3.client(
            "dynamodbstreams", endpoint_url=endpoint, config=Config(account_id_endpoint_mode="disabled")
        )
        self.iterators: dict[str, str | None] = {}  # shard id -> next iterator (None: shard closed and read)
        self.shard_of: dict[str, str] = {}  # sequence number -> stream shard id (for failure messages)

    def read(self) -> list[dict]:
        records = []
        for shard in self.streams.describe_stream(StreamArn=self.arn)["StreamDescription"]["Shards"]:
            shard_id = shard["ShardId"]
            if shard_id not in self.iterators:
                self.iterators[shard_id] = self.streams.get_shard_iterator(
                    StreamArn=self.arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            while self.iterators[shard_id]:
                page = self.streams.get_records(ShardIterator=self.iterators[shard_id], Limit=1000)
                self.iterators[shard_id] = page.get("NextShardIterator")
                records += [self._as_lambda(record) for record in page["Records"]]
                self.shard_of.update({record["dynamodb"]["SequenceNumber"]: shard_id for record in page["Records"]})
                if not page["Records"]:
                    break
        return records

    def _as_lambda(self, record: dict) -> dict:
        created = record["dynamodb"].get("ApproximateCreationDateTime")
        if isinstance(created, datetime):
            record["dynamodb"]["ApproximateCreationDateTime"] = created.timestamp()
        return {**record, "eventSourceARN": self.arn}


class StreamTrigger(threading.Thread):
    """Polls ``reader`` and invokes ``function`` with batches, as ``USAGE_STREAM`` says."""

    def __init__(self, function: str, reader: StreamReader, stop: threading.Event, repair: RepairQueue):
        super().__init__(name=f"stream-{function}", daemon=True)
        self.function, self.reader, self.stop_event, self.repair = function, reader, stop, repair
        self.pending: list[dict] = []
        self.first_waiting_since = 0.0

    def run(self) -> None:
        while not self.stop_event.wait(POLL_SECONDS):
            try:
                self._poll()
            except Exception:  # the stream or moto hiccuped: poll again (records stay in the stream)
                log.exception("reading the usage stream failed")

    def _poll(self) -> None:
        new = self.reader.read()
        if new and not self.pending:
            self.first_waiting_since = time.monotonic()
        self.pending += new
        waited = time.monotonic() - self.first_waiting_since
        while self.pending and (
            len(self.pending) >= USAGE_STREAM.batch_size or waited >= USAGE_STREAM.batching_window_s
        ):
            batch, self.pending = self.pending[: USAGE_STREAM.batch_size], self.pending[USAGE_STREAM.batch_size :]
            self._deliver(batch)

    def _deliver(self, batch: list[dict]) -> None:
        for attempt in range(1, USAGE_STREAM.retries + 2):
            try:
                failures = (invoke_job(self.function, lambda_event(batch)) or {}).get("batchItemFailures")
                if not failures:
                    return
                # ReportBatchItemFailures: the mapping resumes at the first failed record. By its
                # place in the batch: this poller's batches may mix stream shards, whose sequence
                # numbers do not compare (the mapping's never do); a name not in it: all again.
                named = {failure["itemIdentifier"] for failure in failures}
                at = [n for n, record in enumerate(batch) if record["dynamodb"]["SequenceNumber"] in named]
                batch = batch[min(at, default=0) :]
                log.warning("%s: %d records of a stream batch again (attempt %d)", self.function, len(batch), attempt)
            except Exception:  # as Lambda retries a failed batch
                log.exception(
                    "%s failed on a stream batch of %d records (attempt %d)", self.function, len(batch), attempt
                )
            if self.stop_event.wait(min(2.0, 0.1 * 2**attempt)):
                return
        log.error(
            "%s: a stream batch of %d records given up after %d retries; sent to the repair queue",
            self.function,
            len(batch),
            USAGE_STREAM.retries,
        )
        self.repair.send_failure(self.reader, batch)


class RepairQueue:
    """The repair queue on the local moto, named and set (``REPAIR_QUEUE_URL``) as the stack does."""

    NAME = "aggregator-repair"

    def __init__(self):
        self.sqs = boto3.client("sqs")
        self.url = self.sqs.create_queue(QueueName=self.NAME)["QueueUrl"]
        os.environ["REPAIR_QUEUE_URL"] = self.url

    def send_failure(self, reader: StreamReader, batch: list[dict]) -> None:
        """What the mapping's on-failure destination sends: per stream shard, its first and
        last sequence number of the batch."""
        by_shard: dict[str, list[str]] = {}
        for record in batch:
            sequence = record["dynamodb"]["SequenceNumber"]
            by_shard.setdefault(reader.shard_of[sequence], []).append(sequence)
        for shard_id, sequences in by_shard.items():
            info = {
                "shardId": shard_id,
                "startSequenceNumber": min(sequences, key=int),
                "endSequenceNumber": max(sequences, key=int),
                "batchSize": len(sequences),
                "streamArn": reader.arn,
            }
            body = {"requestContext": {"condition": "RetryAttemptsExhausted"}, "DDBStreamBatchInfo": info}
            self.sqs.send_message(QueueUrl=self.url, MessageBody=json.dumps(body))


class RepairTrigger(threading.Thread):
    """Delivers the repair queue to ``function`` as the queue's event source mapping does: up
    to 10 messages an invocation, deleted when it succeeds but for those its reply names
    (``batchItemFailures``), which are delivered again (after the visibility timeout), as
    all are when it fails."""

    def __init__(self, function: str, queue: RepairQueue, stop: threading.Event):
        super().__init__(name=f"repair-{function}", daemon=True)
        self.function, self.queue, self.stop_event = function, queue, stop

    def run(self) -> None:
        while not self.stop_event.wait(POLL_SECONDS):
            try:
                self.deliver()
            except Exception:  # the run failed: its messages come back after the visibility timeout
                log.exception("%s failed on repair messages", self.function)

    def deliver(self) -> int:
        """One receive and invocation; the messages delivered."""
        sqs, url = self.queue.sqs, self.queue.url
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if messages:
            records = [{"eventSource": "aws:sqs", "messageId": m["MessageId"], "body": m["Body"]} for m in messages]
            reply = invoke_job(self.function, {"Records": records}) or {}
            again = {failure["itemIdentifier"] for failure in reply.get("batchItemFailures") or ()}
            done = [m for m in messages if m["MessageId"] not in again]
            if done:
                sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)],
                )
        return len(messages)
