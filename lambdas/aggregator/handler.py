"""Scheduled (EventBridge, every minute): fold the usage shards of the org days in play
into DailyTotal, fire the spend alerts those totals cross, and publish the aggregator lag."""
from dataclasses import asdict

from aws_lambda_powertools.metrics import MetricUnit

from price_keeper import aggregation, alerts
from price_keeper.observability import logger, metrics
from price_keeper.timeutil import utc_now


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    report = aggregation.run()
    fired = alerts.fire_after_run(report, utc_now())
    metrics.add_metric(name="AggregatorLagSeconds", unit=MetricUnit.Seconds, value=report.lag_seconds)
    metrics.add_metric(name="ActiveShards", unit=MetricUnit.Count, value=report.active_shards)
    metrics.add_metric(name="DailyTotalsWritten", unit=MetricUnit.Count, value=report.totals_written)
    metrics.add_metric(name="AlertsFired", unit=MetricUnit.Count, value=len(fired))
    summary = {**asdict(report), "costs": len(report.costs), "changed": len(report.changed), "alerts_fired": len(fired)}
    logger.info("aggregation run", extra={"report": summary})
    return summary
