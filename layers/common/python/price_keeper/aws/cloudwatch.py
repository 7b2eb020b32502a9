"""Bedrock's own counts of calls: CloudWatch's ``AWS/Bedrock`` metrics by ``ModelId``
(ListMetrics, then GetMetricData), summed over a time range."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime

from ..observability import logger
from ..timeutil import iso_utc
from . import client

NAMESPACE = "AWS/Bedrock"
# The metrics summed, in the order of ``domain.reconciliation.Counts`` (store.reconciliation.MARK_FIELDS)
METRICS = (
    "Invocations",
    "InputTokenCount",
    "OutputTokenCount",
    "CacheReadInputTokenCount",
    "CacheWriteInputTokenCount",
)
PERIOD_SECONDS = 60  # Bedrock's datapoints are per minute
MAX_QUERIES = 500  # per GetMetricData call
# The most a one-minute datapoint can be: far beyond any quota, so a larger one is not Bedrock's
# count (anyone allowed PutMetricData can write into AWS/Bedrock).
MAX_DATAPOINT = 10**12


def bedrock_sums(start: datetime, end: datetime) -> dict[str, tuple[int, ...]]:
    """Each ``ModelId``'s sums of ``METRICS`` over calls made in [start, end)."""
    cloudwatch = client("cloudwatch")
    model_ids = sorted(
        {
            dimension["Value"]
            for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=NAMESPACE, MetricName="Invocations")
            for metric in page["Metrics"]
            for dimension in metric.get("Dimensions", [])
            if dimension["Name"] == "ModelId" and len(metric["Dimensions"]) == 1
        }
    )
    asked = {
        f"m{index}_{position}": (model_id, metric)
        for index, model_id in enumerate(model_ids)
        for position, metric in enumerate(METRICS)
    }
    queries = [
        {
            "Id": query_id,
            "MetricStat": {
                "Metric": {
                    "Namespace": NAMESPACE,
                    "MetricName": metric,
                    "Dimensions": [{"Name": "ModelId", "Value": model_id}],
                },
                "Period": PERIOD_SECONDS,
                "Stat": "Sum",
            },
            "ReturnData": True,
        }
        for query_id, (model_id, metric) in asked.items()
    ]
    sums: dict[str, int] = defaultdict(int)
    for first in range(0, len(queries), MAX_QUERIES):
        for page in cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=queries[first : first + MAX_QUERIES], StartTime=start, EndTime=end
        ):
            for result in page["MetricDataResults"]:
                sums[result["Id"]] += _plausible_sum(result, *asked[result["Id"]])
    return {
        model_id: tuple(sums[f"m{index}_{position}"] for position in range(len(METRICS)))
        for index, model_id in enumerate(model_ids)
    }


def _plausible_sum(result: dict, model_id: str, metric: str) -> int:
    """The sum of a query's datapoints that can be counts (whole, 0 to ``MAX_DATAPOINT``); any
    other is logged and left out rather than stop every run of the day."""
    total = 0
    for at, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=True):
        if math.isfinite(value) and 0 <= value <= MAX_DATAPOINT and value == int(value):
            total += int(value)
        else:
            logger.warning(
                "AWS/Bedrock datapoint left out: not a count",
                extra={"model_id": model_id, "metric": metric, "at": iso_utc(at), "value": repr(value)},
            )
    return total
