"""Per-client rate limits: exact across containers, amortised in DynamoDB calls."""
from price_keeper import ratelimit
from price_keeper.aws import ddb_client
from price_keeper.errors import ApiError
from tests.conftest import assert_error
from tests.factories import seed_org

NOW = 1_800_000_000.0  # a window start: 1_800_000_000 is a multiple of 60


def admitted(client: str, attempts: int, *, now: float = NOW, new_container_each_time: bool = False) -> int:
    count = 0
    for _ in range(attempts):
        if new_container_each_time:
            ratelimit._local.clear()
        try:
            ratelimit.consume(client, now=now)
            count += 1
        except ApiError as error:
            assert error.status == 429 and error.code == "RATE_LIMIT_EXCEEDED"
    return count


def test_one_container_admits_exactly_the_limit(limits_on):
    ratelimit.begin_request("model_selection")  # 120 / minute
    assert admitted("client-a", 150) == 120


def test_many_containers_never_admit_more_than_the_limit(limits_on):
    ratelimit.begin_request("model_selection")
    assert admitted("client-a", 300, new_container_each_time=True) <= 120


def test_clients_have_separate_allowances(limits_on):
    ratelimit.begin_request("auth_token")  # 10 / minute
    assert admitted("client-a", 12) == 10
    assert admitted("client-b", 12) == 10


def test_next_window_starts_afresh(limits_on):
    ratelimit.begin_request("auth_token")
    assert admitted("client-a", 11) == 10
    assert admitted("client-a", 11, now=NOW + 60) == 10


def test_usage_limit_costs_one_write_per_fifty_requests(limits_on):
    calls = []
    ddb_client().meta.events.register("before-call.dynamodb.UpdateItem", lambda **kw: calls.append(1))
    ratelimit.begin_request("usage")  # 1000 / minute, leased 50 at a time
    assert admitted("client-a", 1000) == 1000
    assert len(calls) == 20
    assert admitted("client-a", 5) == 0


def test_switched_off_by_environment(limits_on, monkeypatch):
    monkeypatch.setenv("RATE_LIMITS", "off")
    ratelimit.begin_request("auth_token")
    assert admitted("client-a", 50) == 50


def test_token_endpoint_answers_429_with_headers(limits_on, api):
    org_id = seed_org()
    body = {"client_id": f"org-{org_id}", "client_secret": "wrong", "grant_type": "client_credentials"}
    statuses = [api.post("/auth/token", body).status for _ in range(10)]
    assert statuses == [401] * 10
    reply = api.post("/auth/token", body)
    error = assert_error(reply, 429, "RATE_LIMIT_EXCEEDED")
    assert 1 <= error["retry_after"] <= 60
    assert reply.headers["retry-after"] == str(error["retry_after"])
    assert reply.headers["x-ratelimit-limit"] == "10"
    assert reply.headers["x-ratelimit-remaining"] == "0"
    assert reply.headers["x-ratelimit-clientid"] == f"org-{org_id}"
