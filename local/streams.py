"""The usage table's DynamoDB Stream, delivered to the aggregator as Lambda's event source
mapping delivers it (``price_keeper.domain.aggregation.USAGE_STREAM``): the local server polls the
stream (moto's, or DynamoDB Local's) from a thread and invokes the same aggregator handler
with Lambda-shaped batches, so ``make run`` folds usage within seconds as AWS does.

Like the mapping: reading starts at ``TRIM_HORIZON`` (after a restart, the replayed journal's
writes come again, with the sequence numbers they had, and the ledger's shard progress
skips them), a batch holds one stream shard's records and names it (``shardId``, as the
mapping's tumbling window does), it is sent when ``batch_size`` records wait or the first
has waited ``batching_window_s``, and a batch that fails is delivered again, from the
record its reply names (``batchItemFailures``), until it is folded. ``RepairTrigger``
delivers the repair queue (moto's SQS) to the aggregator as the queue's mapping does: the
same fan-out code as deployed (``price_keeper.domain.repair``), the audit's chunks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import boto3
from botocore.config import Config

from price_keeper.domain.aggregation import USAGE_STREAM
from price_keeper.store.tables import TableSpec

from .gateway import invoke_job

log = logging.getLogger("price_keeper.local")
POLL_SECONDS = 0.2


def lambda_event(records: list[dict], shard_id: str) -> dict:
    """A stream shard's batch as the mapping's tumbling window hands it over."""
    return {"Records": records, "shardId": shard_id, "state": {}, "isFinalInvokeForWindow": False}


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

    def read(self) -> dict[str, list[dict]]:
        """Each stream shard's new records (shard id -> records, in order)."""
        records: dict[str, list[dict]] = {}
        for shard in self.streams.describe_stream(StreamArn=self.arn)["StreamDescription"]["Shards"]:
            shard_id = shard["ShardId"]
            if shard_id not in self.iterators:
                self.iterators[shard_id] = self.streams.get_shard_iterator(
                    StreamArn=self.arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            while self.iterators[shard_id]:
                page = self.streams.get_records(ShardIterator=self.iterators[shard_id], Limit=1000)
                self.iterators[shard_id] = page.get("NextShardIterator")
                records.setdefault(shard_id, []).extend(self._as_lambda(record) for record in page["Records"])
                if not page["Records"]:
                    break
        return records

    def event(self) -> dict:
        """The new records of a stream of one shard (moto's) as one event (maybe of none)."""
        ((shard_id, records),) = self.read().items()
        return lambda_event(records, shard_id)

    def _as_lambda(self, record: dict) -> dict:
        created = record["dynamodb"].get("ApproximateCreationDateTime")
        if isinstance(created, datetime):
            record["dynamodb"]["ApproximateCreationDateTime"] = created.timestamp()
        return {**record, "eventSourceARN": self.arn}


class StreamTrigger(threading.Thread):
    """Polls ``reader`` and invokes ``function`` with each shard's batches, as ``USAGE_STREAM``
    says: one batch at a time per shard, the shards at once."""

    def __init__(self, function: str, reader: StreamReader, stop: threading.Event):
        super().__init__(name=f"stream-{function}", daemon=True)
        self.function, self.reader, self.stop_event = function, reader, stop
        self.pending: dict[str, list[dict]] = {}  # shard id -> records not delivered yet
        self.first_waiting_since: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop_event.wait(POLL_SECONDS):
            try:
                self._poll()
            except Exception:  # the stream or moto hiccuped: poll again (records stay in the stream)
                log.exception("reading the usage stream failed")

    def _poll(self) -> None:
        for shard_id, new in self.reader.read().items():
            if new and not self.pending.get(shard_id):
                self.first_waiting_since[shard_id] = time.monotonic()
            self.pending.setdefault(shard_id, []).extend(new)
        due = [shard_id for shard_id in self.pending if self._due(shard_id)]
        if len(due) > 1:  # the shards' batches at once, each shard's one at a time
            with ThreadPoolExecutor(len(due)) as pool:
                list(pool.map(self._drain, due))
        elif due:
            self._drain(due[0])

    def _due(self, shard_id: str) -> bool:
        pending = self.pending[shard_id]
        waited = time.monotonic() - self.first_waiting_since.get(shard_id, 0.0)
        return bool(pending) and (len(pending) >= USAGE_STREAM.batch_size or waited >= USAGE_STREAM.batching_window_s)

    def _drain(self, shard_id: str) -> None:
        """Deliver the shard's batches that are due, one after another."""
        pending = self.pending[shard_id]
        while self._due(shard_id):
            batch, pending[:] = pending[: USAGE_STREAM.batch_size], pending[USAGE_STREAM.batch_size :]
            if not self._deliver(shard_id, batch):
                return  # stopping

    def _deliver(self, shard_id: str, batch: list[dict]) -> bool:
        """Invoke until the batch is folded (the mapping's retries have no limit); False when
        the server stops first."""
        attempt = 0
        while True:
            attempt += 1
            try:
                failures = (invoke_job(self.function, lambda_event(batch, shard_id)) or {}).get("batchItemFailures")
                if not failures:
                    return True
                # ReportBatchItemFailures: the mapping resumes at the first failed record (a name
                # not in the batch: all of it again)
                named = {failure["itemIdentifier"] for failure in failures}
                at = [n for n, record in enumerate(batch) if record["dynamodb"]["SequenceNumber"] in named]
                batch = batch[min(at, default=0) :]
                log.warning("%s: %d records of a stream batch again (attempt %d)", self.function, len(batch), attempt)
            except Exception:  # as Lambda retries a failed batch
                log.exception(
                    "%s failed on a stream batch of %d records (attempt %d)", self.function, len(batch), attempt
                )
            if self.stop_event.wait(min(2.0, 0.1 * 2**attempt)):
                return False


class RepairQueue:
    """The repair queue on the local moto, named and set (``REPAIR_QUEUE_URL``) as the stack does."""

    NAME = "aggregator-repair"

    def __init__(self):
        self.sqs = boto3.client("sqs")
        self.url = self.sqs.create_queue(QueueName=self.NAME)["QueueUrl"]
        os.environ["REPAIR_QUEUE_URL"] = self.url


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
