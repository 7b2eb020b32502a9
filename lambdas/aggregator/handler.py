"""The aggregator: folds usage shards into DailyTotal, fires the spend alerts those totals
cross, publishes the aggregator lag and how close
each changed scope is to its quotas. Two triggers, one fold (``price_keeper.domain.aggregation``):
the usage table's DynamoDB Stream (event source mapping: the labels a batch of usage writes
changed, within seconds) and the repair queue (SQS: stream batches that failed for good, and
the audit's chunks, which the EventBridge schedule plans; ``price_keeper.domain.repair``).
The fold is idempotent: a stream batch with a scope-day that failed raises, and Lambda
retries it; from the repair queue, the messages naming one are reported
(``batchItemFailures``) and delivered again, the others deleted."""

from dataclasses import asdict

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

from price_keeper.domain import aggregation, alerts, repair
from price_keeper.metric_names import AGGREGATOR_LAG_SECONDS, SPEND_PCT
from price_keeper.observability import logger, metrics
from price_keeper.timeutil import utc_now


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    records = event.get("Records") or []
    trigger = records[0].get("eventSource", "aws:dynamodb") if records else "schedule"
    if trigger == "schedule" and repair.queue_url():  # the audit: its label-days go to the repair queue
        planned = repair.plan_audit()
        logger.info("audit planned", extra={"plan": planned})
        return {**planned, "trigger": trigger}
    if trigger == "schedule":  # no repair queue (tests, tools): the audit in this invocation
        report = aggregation.run()
    elif trigger == "aws:sqs":
        report, failed_messages = repair.repair({record["messageId"]: record["body"] for record in records})
    else:
        report = aggregation.fold_stream(DynamoDBStreamEvent(event).records)
    now = utc_now()
    fired = alerts.fire_after_run(report, now)
    metrics.add_metric(name=AGGREGATOR_LAG_SECONDS, unit=MetricUnit.Seconds, value=report.lag_seconds)
    metrics.add_metric(name="ActiveShards", unit=MetricUnit.Count, value=report.active_shards)
    metrics.add_metric(name="DailyTotalsWritten", unit=MetricUnit.Count, value=report.totals_written)
    metrics.add_metric(name="AlertsFired", unit=MetricUnit.Count, value=len(fired))
    for pct in alerts.spend_pcts(report, now):  # one metric, a value per quota (Powertools flushes each 100)
        metrics.add_metric(name=SPEND_PCT, unit=MetricUnit.Percent, value=pct)
    summary = {
        **asdict(report),
        "failed": len(report.failed),
        "costs": len(report.costs),
        "changed": len(report.changed),
        "alerts_fired": len(fired),
        "trigger": trigger,
    }
    logger.info("aggregation run", extra={"report": summary})
    if trigger == "aws:sqs":  # the mapping's ReportBatchItemFailures: only these come back
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed_messages]}
    report.raise_if_failed()  # the others are folded and alerted: retry the batch for the failed ones
    return summary
