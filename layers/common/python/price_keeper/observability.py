"""Powertools Logger, Tracer and Metrics shared by every function."""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "price-keeper")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "BedrockPriceKeeper")

logger = Logger(service=SERVICE)
# Only botocore is patched: it is all the I/O there is, and patching every library the X-Ray
# SDK knows imports each one that is installed (requests, sqlite3, ...) at cold start.
tracer = Tracer(service=SERVICE, patch_modules=("botocore",))
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


def count(name: str) -> None:
    """One occurrence of an event, added to the custom metric ``name`` (``metric_names``);
    the handler's ``log_metrics`` publishes it when the invocation ends."""
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
