"""The reconciler (EventBridge, hourly; ``RECONCILE_INTERVAL_SECONDS`` on the local stack):
Bedrock's CloudWatch counts against the metered ones for today (UTC) and, until its late
reports are in, yesterday; the results are kept per day and large gaps raise
``UNREPORTED_USAGE`` (``domain.reconciliation``)."""

from aws_lambda_powertools.metrics import MetricUnit

from price_keeper.domain import reconciliation
from price_keeper.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    results = reconciliation.run()
    unmetered = sum(row["unmetered"]["estimated_cost_usd_micros"] for row in results[-1]["models"])
    metrics.add_metric(name="UnmeteredUsdMicros", unit=MetricUnit.Count, value=unmetered)
    return {"days": [result["date"] for result in results], "unmetered_usd_micros_today": unmetered}
