"""``report_batch_job`` against the real local server: a batch inference job's output records
(S3 on moto, shaped as Bedrock writes them) reported as BATCH usage at the batch rate, each
record once, a second run reporting nothing new; the job found by its ARN (Bedrock's
GetModelInvocationJob answered by Stubber: moto has no batch jobs) or by its output folder."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from price_keeper_client import report_batch_job
from price_keeper_client.batch_jobs import batch_request_id

from .conftest import provision
from .test_runtime_server import PREMIUM, make_keeper

pytestmark = pytest.mark.e2e

JOB_ID = "a1b2c3d4e5f6"
JOB_ARN = f"arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/{JOB_ID}"
BUCKET = "batch-output"


def converse_output(input_tokens: int, output_tokens: int) -> dict:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
        "stopReason": "end_turn",
        "usage": {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": input_tokens + output_tokens,
        },
    }


RECORDS = [
    {"recordId": "REC00000001", "modelInput": {}, "modelOutput": converse_output(10_000, 10_000)},
    {"recordId": "REC00000002", "modelInput": {}, "modelOutput": converse_output(20_000, 5_000)},
    {"recordId": "REC00000003", "modelInput": {}, "error": {"errorCode": 400, "errorMessage": "bad request"}},
]
# Nova Pro (config.yaml premium) at its batch rate, half of 0.80 / 3.20 USD per 1M tokens
BATCH_COSTS = [(10_000 * 400_000 + 10_000 * 1_600_000) // 10**6, (20_000 * 400_000 + 5_000 * 1_600_000) // 10**6]


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        lines = "\n".join(json.dumps(record) for record in RECORDS) + "\n"
        client.put_object(Bucket=BUCKET, Key=f"jobs/{JOB_ID}/input.jsonl.out", Body=lines.encode())
        client.put_object(Bucket=BUCKET, Key=f"jobs/{JOB_ID}/manifest.json.out", Body=b'{"totalRecordCount": 3}')
        yield client


def test_a_batch_job_is_reported_once_per_record_at_the_batch_rate(server, s3):
    _, creds = provision(server)
    keeper, calls = make_keeper(server, creds)
    bedrock = boto3.client("bedrock", region_name="us-east-1")
    stubber = Stubber(bedrock)
    job = {
        "jobArn": JOB_ARN,
        "jobName": "nightly",
        "modelId": PREMIUM,
        "roleArn": "arn:aws:iam::123456789012:role/batch",
        "status": "Completed",
        "submitTime": "2026-01-01T00:00:00Z",
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{BUCKET}/input/"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{BUCKET}/jobs/"}},
    }
    stubber.add_response("get_model_invocation_job", job, {"jobIdentifier": JOB_ARN})
    with stubber:
        first = report_batch_job(keeper, model_label="premium", job_arn=JOB_ARN, s3_client=s3, bedrock_client=bedrock)
    assert (first.job_id, first.records, first.counted, first.duplicates, first.failed_in_job) == (JOB_ID, 2, 2, 0, 1)
    (sent,) = calls.bodies("POST", "/usage/batch")
    assert [record["request_id"] for record in sent["requests"]] == [
        batch_request_id(JOB_ID, f"jobs/{JOB_ID}/input.jsonl.out", record_id)
        for record_id in ("REC00000001", "REC00000002")
    ]
    assert {record["inference_type"] for record in sent["requests"]} == {"BATCH"}
    assert {record["bedrock_model_id"] for record in sent["requests"]} == {PREMIUM}
    assert first.cost_usd_micros == sum(BATCH_COSTS)

    # the same job again, by its output folder: the same request ids, nothing new counted
    again = report_batch_job(
        keeper, model_label="premium", s3_output=f"s3://{BUCKET}/jobs/{JOB_ID}/", bedrock_model_id=PREMIUM, s3_client=s3
    )
    assert (again.records, again.counted, again.duplicates, again.refused, again.cost_usd_micros) == (2, 0, 2, 0, 0)
    assert keeper.close()
