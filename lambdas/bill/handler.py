"""The bill comparison (EventBridge, daily; optional): each application inference profile's
metered spend against Cost Explorer's cost for its cost-allocation tag, three days back
(``domain.bill``). Does nothing unless config.yaml ``reconciliation.bill_tag_key`` is set."""

from aws_lambda_powertools.metrics import MetricUnit

from price_keeper.domain import bill
from price_keeper.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    result = bill.run()
    if result is None:
        return {"compared": False}
    gap = sum(row["unmetered_usd_micros"] for row in result["profiles"])
    metrics.add_metric(name="BilledBeyondMeteredUsdMicros", unit=MetricUnit.Count, value=gap)
    return {"compared": True, "date": result["date"], "billed_beyond_metered_usd_micros": gap}
