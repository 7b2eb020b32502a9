"""Read Bedrock on-demand token prices from the AWS Price List API into PricingCache:
daily (EventBridge schedule) for every configured and registered model, and for one model
on its ``UNPRICED_MODEL`` alert event (first sight of a model outside config.yaml); then the
records counted at the estimate whose price is now known are re-priced. When the
API is unreachable the run reports it and the stored or config prices keep serving (the run
does not fail, so the schedule never crash-loops). A model whose re-pricing fails fails the
run once the other models are re-priced (``pricing.RepricingFailed``), so it is retried."""

from aws_lambda_powertools.metrics import MetricUnit

from price_keeper.domain import pricing
from price_keeper.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
    if detail.get("type") == "UNPRICED_MODEL" and detail.get("model_id"):
        report = pricing.price_unpriced_model(detail["model_id"], detail.get("region"))
    else:
        report = pricing.refresh_pricing_cache()
    metrics.add_metric(name="PricesWritten", unit=MetricUnit.Count, value=report["written"])
    metrics.add_metric(
        name="PriceListUnavailable", unit=MetricUnit.Count, value=1 if report["status"] == "unavailable" else 0
    )
    return report
