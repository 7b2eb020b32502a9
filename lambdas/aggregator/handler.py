"""The aggregator: folds usage into DailyTotal, fires the spend alerts those totals cross,
publishes the aggregator lag and how close each changed scope is to its quotas. Three
triggers: the usage table's DynamoDB Stream (event source mapping: one stream shard's
batch, within seconds, its shard named by the mapping's tumbling window;
``price_keeper.domain.ledger``, which counts a record once however often it is
delivered), the EventBridge schedule (the audit's plan) and the repair queue (SQS: the
audit's chunks; ``price_keeper.domain.repair``). What failed is reported to the event
source mapping (``batchItemFailures``, ``ReportBatchItemFailures``): for the stream, the
first record not folded, from which the batch is delivered again; for the repair queue,
the messages that cannot be read."""

from dataclasses import asdict

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

from price_keeper.aws import repair_queue
from price_keeper.domain import alerts, ledger, repair
from price_keeper.metric_names import AGGREGATOR_LAG_SECONDS, SPEND_PCT
from price_keeper.observability import logger, metrics
from price_keeper.timeutil import utc_now


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    records = event.get("Records") or []
    if "shardId" in event:  # the usage stream (its mapping's tumbling window names the shard)
        return _stream_batch(event, records)
    trigger = records[0].get("eventSource") if records else "schedule"
    if trigger == "aws:dynamodb":  # the ledger keeps its progress per shard: it must know which
        raise ValueError("a usage stream batch without its shardId: the mapping needs its tumbling window")
    if trigger == "schedule" and repair_queue.queue_url():  # the audit: its label-days go to the repair queue
        planned = repair.plan_audit()
        logger.info("audit planned", extra={"plan": planned})
        return {**planned, "trigger": trigger}
    failed_items: list[str] = []  # what the event source mapping delivers again (messages, or where a stream resumes)
    if trigger == "schedule":  # no repair queue (tests, tools): the audit in this invocation
        report = repair.run()
    else:
        report, failed_items = repair.repair({record["messageId"]: record["body"] for record in records})
    return _reported(report, trigger, failed_items)


def _stream_batch(event: dict, records: list) -> dict:
    """A stream shard's batch: folded, and what the mapping delivers again named. The reply
    carries the tumbling window's ``state`` (none kept), without which Lambda counts the
    invocation failed; the window's last invocation may have no records."""
    if not records:
        return {"state": {}}
    report, first = ledger.fold_batch(DynamoDBStreamEvent(event).records, event["shardId"])
    return {"state": {}, **_reported(report, "aws:dynamodb", [first] if first else [])}


def _reported(report, trigger: str, failed_items: list[str]) -> dict:
    """Alerts and metrics of a run, its summary logged; the items to deliver again, if any."""
    now = utc_now()
    fired = alerts.fire_after_run(report, now)
    metrics.add_metric(name=AGGREGATOR_LAG_SECONDS, unit=MetricUnit.Seconds, value=report.lag_seconds)
    metrics.add_metric(name="DailyTotalsWritten", unit=MetricUnit.Count, value=report.totals_written)
    metrics.add_metric(name="AlertsFired", unit=MetricUnit.Count, value=len(fired))
    for pct in alerts.spend_pcts(report, now):  # one metric, a value per quota (Powertools flushes each 100)
        metrics.add_metric(name=SPEND_PCT, unit=MetricUnit.Percent, value=pct)
    summary = {  # counts of the report's lists and maps (their tuples are not JSON)
        **asdict(report),
        "costs": len(report.costs),
        "changed": len(report.changed),
        "evaluated": len(report.evaluated),
        "scope_costs": len(report.scope_costs),
        "sticky": len(report.sticky),
        "alerts_fired": len(fired),
        "trigger": trigger,
    }
    logger.info("aggregation run", extra={"report": summary})
    if failed_items:  # a failed fold's records or messages, or unreadable ones: the others are done
        return {"batchItemFailures": [{"itemIdentifier": item} for item in failed_items]}
    return summary
