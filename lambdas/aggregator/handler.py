"""The aggregator: folds usage shards into DailyTotal, fires the spend alerts those totals
cross, publishes the aggregator lag and how close
each changed scope is to its quotas. Two triggers, one fold (``price_keeper.domain.aggregation``):
the usage table's DynamoDB Stream (event source mapping: the labels a batch of usage writes
changed, within seconds) and the repair queue (SQS: stream batches that failed for good, and
the audit's chunks, which the EventBridge schedule plans; ``price_keeper.domain.repair``).
The fold is idempotent. A scope-day whose fold failed is reported to the event source
mapping (``batchItemFailures``, ``ReportBatchItemFailures``): for the stream, its first
record, from which the batch is delivered again; for the repair queue, the messages naming
it, delivered again while the others are deleted."""

from dataclasses import asdict

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

from price_keeper.domain import aggregation, alerts, ledger, repair
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
    failed_items: list[str] = []  # what the event source mapping delivers again (messages, or where a stream resumes)
    if trigger == "schedule":  # no repair queue (tests, tools): the audit in this invocation
        report = aggregation.run()
    elif trigger == "aws:sqs":
        report, failed_items = repair.repair({record["messageId"]: record["body"] for record in records})
    else:
        report, first = ledger.fold_batch(DynamoDBStreamEvent(event).records)
        failed_items = [first] if first else []
    now = utc_now()
    fired = alerts.fire_after_run(report, now)
    metrics.add_metric(name=AGGREGATOR_LAG_SECONDS, unit=MetricUnit.Seconds, value=report.lag_seconds)
    metrics.add_metric(name="ActiveShards", unit=MetricUnit.Count, value=report.active_shards)
    metrics.add_metric(name="DailyTotalsWritten", unit=MetricUnit.Count, value=report.totals_written)
    metrics.add_metric(name="AlertsFired", unit=MetricUnit.Count, value=len(fired))
    for pct in alerts.spend_pcts(report, now):  # one metric, a value per quota (Powertools flushes each 100)
        metrics.add_metric(name=SPEND_PCT, unit=MetricUnit.Percent, value=pct)
    summary = {  # counts of the report's lists and maps (their tuples are not JSON)
        **asdict(report),
        "failed": len(report.failed),
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
    report.raise_if_failed()  # the schedule's run, or failures no item names: retry it all
    return summary
