"""Scheduled (EventBridge, daily): read Bedrock on-demand token prices from the AWS Price
List API into PricingCache. When the API is unreachable the run reports it and the config
prices keep serving (the run does not fail, so the schedule never crash-loops)."""
from aws_lambda_powertools.metrics import MetricUnit

from price_keeper import pricing
from price_keeper.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    report = pricing.refresh_pricing_cache()
    metrics.add_metric(name="PricesWritten", unit=MetricUnit.Count, value=report["written"])
    metrics.add_metric(name="PriceListUnavailable", unit=MetricUnit.Count,
                       value=1 if report["status"] == "unavailable" else 0)
    return report
