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


def fail_calls(operation: str, times: int, code: str = "ProvisionedThroughputExceededException", after: int = 0):
    """Let ``after`` calls of ``operation`` through, then fail the next ``times`` as a
    throttled (or erring) DynamoDB would. The injected reply replaces the whole call,
    botocore's own retries included, so each injected failure is a store that kept failing."""
    left = {"n": times, "passed": after}

    def throttle(**_):
        if left["passed"] > 0:
            left["passed"] -= 1
            return None
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
    fail_calls("TransactWriteItems", 3)
    for _ in range(3):  # the store stays throttled across the client's first retries
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
    fail_calls("PutItem", 1, code="InternalServerError", after=1)  # one total written, the second fails
    with pytest.raises(ClientError, match="InternalServerError"):
        aggregation.run()
    day = org_day("America/New_York")

    def totals():
        return [daily_total(keys.scope_key(t.org_id, t.app_id, "APP"), "premium", day) for t in tenants]

    assert sum(total is not None for total in totals()) == 1  # the run stopped half-way
    aggregation.run()
    aggregation.run()
    for total in totals():
        assert total["requests"] == 1 and total["cost_usd_micros"] == 3_760
