"""Faults injected into DynamoDB mid-request: clients get a retryable 503, and a retried
record is still counted exactly once."""
from types import SimpleNamespace

import pytest
from botocore.exceptions import ClientError

from price_keeper import aggregation, keys
from price_keeper.aws import ddb_client
from price_keeper.timeutil import org_day
from tests.conftest import assert_error
from tests.usage_support import daily_total, new_tenant, usage_body


def fail_calls(operation: str, times: int, code: str = "ProvisionedThroughputExceededException"):
    """Make the next ``times`` calls of ``operation`` fail as a throttled DynamoDB would."""
    left = {"n": times}

    def throttle(**_):
        if left["n"] <= 0:
            return None
        left["n"] -= 1
        return SimpleNamespace(status_code=400), {"Error": {"Code": code, "Message": "injected"},
                                                  "ResponseMetadata": {"HTTPStatusCode": 400}}

    ddb_client().meta.events.register(f"before-call.dynamodb.{operation}", throttle)
    return left


def test_throttled_store_is_503_and_the_retry_counts_once(api):
    tenant = new_tenant()
    body = usage_body()
    fail_calls("TransactWriteItems", 1)
    reply = api.post(f"{tenant.app_path}/usage", body, token=tenant.token)
    assert_error(reply, 503, "SERVICE_UNAVAILABLE")
    assert reply.headers["retry-after"] == "1"
    for _ in range(2):  # the client retries (twice, even) with the same request_id
        assert api.post(f"{tenant.app_path}/usage", body, token=tenant.token).status == 202
    aggregation.run()
    total = daily_total(tenant.scope, "premium", org_day("America/New_York"))
    assert total["requests"] == 1 and total["cost_usd_micros"] == 3_760


def test_aggregator_resumes_after_a_failed_run_without_double_counting(api):
    tenants = [new_tenant(app_id=f"app-{n}") for n in range(3)]
    for tenant in tenants:
        assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    fail_calls("PutItem", 1, code="InternalServerError")  # the first total's write fails: the run stops
    with pytest.raises(ClientError, match="InternalServerError"):
        aggregation.run()
    aggregation.run()
    aggregation.run()
    day = org_day("America/New_York")
    for tenant in tenants:
        total = daily_total(keys.scope_key(tenant.org_id, tenant.app_id, "APP"), "premium", day)
        assert total["requests"] == 1 and total["cost_usd_micros"] == 3_760
