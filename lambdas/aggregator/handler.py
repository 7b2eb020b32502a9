"""Scheduled (EventBridge, every minute): fold the usage shards of the org days in play
into DailyTotal and publish the aggregator lag."""
from dataclasses import asdict

from aws_lambda_powertools.metrics import MetricUnit

from price_keeper import aggregation
from price_keeper.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    report = aggregation.run()
    metrics.add_metric(name="AggregatorLagSeconds", unit=MetricUnit.Seconds, value=report.lag_seconds)
    metrics.add_metric(name="ActiveShards", unit=MetricUnit.Count, value=report.active_shards)
    metrics.add_metric(name="DailyTotalsWritten", unit=MetricUnit.Count, value=report.totals_written)
    logger.info("aggregation run", extra={"report": asdict(report)})
    return asdict(report)
