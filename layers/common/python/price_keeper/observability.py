"""Powertools Logger, Tracer and Metrics shared by every function."""
from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "price-keeper")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "BedrockPriceKeeper")

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
