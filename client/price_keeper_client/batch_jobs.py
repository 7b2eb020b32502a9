"""A Bedrock batch inference job's usage, reported from its output in S3.

A batch job is billed at the batch rate and never goes through ``converse``: its usage is
in the job's output records (``*.jsonl.out``, one ``{"recordId", "modelInput",
"modelOutput"}`` a line, an ``error`` instead of ``modelOutput`` for a record that failed).
``report_batch_job`` reads them and reports each answered record as a ``BATCH`` usage record
whose ``request_id`` is derived from the job and the record, so running it again (a retry,
a second run over a job still being written) reports nothing twice: the service answers a
record it counted before as a duplicate.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

from .models import UsageRecord

# The namespace of the request ids of batch records (uuid5 of job and record).
BATCH_NAMESPACE = uuid.UUID("6d1c3b8e-58a4-4f0e-9d4b-2b0f3f6a9c11")
OUTPUT_SUFFIX = ".jsonl.out"

# The token counts of ``modelOutput`` as each API shape names them: Converse's, and the
# InvokeModel bodies of Anthropic, Amazon Nova, Titan and Llama models.
_COUNTS = {
    "input": ("inputTokens", "input_tokens", "inputTextTokenCount", "prompt_token_count"),
    "output": ("outputTokens", "output_tokens", "generation_token_count"),
    "cache_read": ("cacheReadInputTokens", "cache_read_input_tokens", "cacheReadInputTokenCount"),
    "cache_write": ("cacheWriteInputTokens", "cache_creation_input_tokens", "cacheWriteInputTokenCount"),
}


@dataclass(frozen=True)
class BatchJobReport:
    """What ``report_batch_job`` found and reported: records answered by the job, newly
    counted, counted before (duplicates), refused, records the job failed (not billed), and
    the cost of those newly counted."""

    job_id: str
    records: int
    counted: int
    duplicates: int
    refused: int
    failed_in_job: int
    cost_usd_micros: int  # what the records newly counted cost, as the service priced them


def _count(output: dict, kind: str) -> int:
    usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    for name in _COUNTS[kind]:
        for where in (usage, output):
            if isinstance(where.get(name), int):
                return where[name]
    if kind == "output" and isinstance(output.get("results"), list):  # Titan
        return sum(int(result.get("tokenCount", 0)) for result in output["results"])
    return 0


def _one_hour_writes(output: dict) -> int:
    usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    details = usage.get("cacheDetails") or []  # Converse
    from_details = sum(int(d.get("inputTokens", 0)) for d in details if d.get("ttl") == "1h")
    creation = usage.get("cache_creation") or {}  # Anthropic
    return from_details or int(creation.get("ephemeral_1h_input_tokens", 0))


def _split(s3_uri: str) -> tuple[str, str]:
    parsed = urlparse(s3_uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an S3 URI: {s3_uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def _output_records(s3, bucket: str, prefix: str) -> Iterator[tuple[str, int, dict]]:
    """(output object key, line number, record) of every output record under ``prefix``."""
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in sorted(page.get("Contents") or [], key=lambda entry: entry["Key"]):
            if not item["Key"].endswith(OUTPUT_SUFFIX):
                continue
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read().decode()
            for number, line in enumerate(body.splitlines()):
                if line.strip():
                    yield item["Key"], number, json.loads(line)


def batch_request_id(job_id: str, output_key: str, record_id: str) -> str:
    """The usage record's request id of one output record: the same on every run."""
    return str(uuid.uuid5(BATCH_NAMESPACE, f"{job_id}\n{output_key.rsplit('/', 1)[-1]}\n{record_id}"))


def report_batch_job(
    keeper: Any,
    *,
    model_label: str,
    job_arn: str | None = None,
    s3_output: str | None = None,
    bedrock_model_id: str | None = None,
    calling_region: str | None = None,
    s3_client: Any = None,
    bedrock_client: Any = None,
) -> BatchJobReport:
    """Report a finished batch inference job's usage through ``keeper`` (a ``PriceKeeper``),
    each answered output record once, as ``BATCH`` usage of ``model_label``.

    ``job_arn``: the job (``GetModelInvocationJob`` gives its output location and model; its
    output is under ``{s3Uri}/{job id}/``). Or ``s3_output``: the job's output folder
    itself (``s3://bucket/prefix/{job id}/``), with ``bedrock_model_id``. Records the job
    failed (an ``error`` instead of ``modelOutput``) are not billed and not reported.
    """
    import boto3  # the client's users have it: they call Bedrock

    if (job_arn is None) == (s3_output is None):
        raise ValueError("give job_arn or s3_output, one of them")
    if job_arn is not None:
        bedrock = bedrock_client or boto3.client("bedrock", region_name=calling_region)
        job = bedrock.get_model_invocation_job(jobIdentifier=job_arn)
        job_id = job_arn.rsplit("/", 1)[-1]
        bucket, prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        prefix = f"{prefix.rstrip('/')}/{job_id}/".lstrip("/")
        bedrock_model_id = bedrock_model_id or job["modelId"]
    else:
        bucket, prefix = _split(s3_output)
        job_id = prefix.rstrip("/").rsplit("/", 1)[-1]
        if not bedrock_model_id:
            raise ValueError("s3_output needs bedrock_model_id: the output records do not name the model")
    s3 = s3_client or boto3.client("s3", region_name=calling_region)
    now = datetime.now(UTC)
    records, failed = [], 0
    for key, number, line in _output_records(s3, bucket, prefix):
        output = line.get("modelOutput")
        if not isinstance(output, dict):
            failed += 1
            continue
        cache_write = _count(output, "cache_write")
        records.append(
            UsageRecord(
                request_id=batch_request_id(job_id, key, str(line.get("recordId") or f"line-{number}")),
                model_label=model_label,
                bedrock_model_id=bedrock_model_id,
                input_tokens=_count(output, "input"),
                output_tokens=_count(output, "output"),
                timestamp=now,
                calling_region=calling_region,
                cache_read_input_tokens=_count(output, "cache_read"),
                cache_write_input_tokens=cache_write,
                cache_write_1h_input_tokens=min(cache_write, _one_hour_writes(output)),
                inference_type="BATCH",
            )
        )
    results = [item for batch in keeper.report_usage_batch(records) for item in batch.results] if records else []
    accepted = [item for item in results if item.status == "accepted"]
    duplicates = sum(1 for item in accepted if item.duplicate)
    return BatchJobReport(
        job_id=job_id,
        records=len(records),
        counted=len(accepted) - duplicates,
        duplicates=duplicates,
        refused=len(results) - len(accepted),
        failed_in_job=failed,
        cost_usd_micros=sum(item.cost_usd_micros or 0 for item in accepted if not item.duplicate),
    )
