"""DynamoDB calls per request through the real handlers, as one warm Lambda container sees
a busy client: the per-request budget of the design (docs/performance.md), all-in, with
token checks and rate-limit leases included. Call counts are deterministic, so they are
asserted; time is not (benchmarks/ measures it)."""

from collections import Counter

import pytest

from price_keeper import ratelimit
from price_keeper.store.dynamo import ddb_client
from tests.usage_support import new_tenant, usage_body

WARM_REQUESTS = 60


@pytest.fixture
def calls(api, limits_on):
    """DynamoDB operations the service's client makes, counted; rate limits on."""
    seen: Counter = Counter()

    def count(model, **_):
        seen[model.name] += 1

    ddb_client().meta.events.register("before-call.dynamodb", count)
    yield seen
    ddb_client().meta.events.unregister("before-call.dynamodb", count)


def leases(requests: int, limit: int) -> int:
    """Rate-limit writes for ``requests`` in one container: one per lease, leases growing
    with what the container admitted (``ratelimit.lease_size``), plus one if the minute's
    window turned over during the run."""
    held, writes = ratelimit.Held(0, 0, 0, 0), 0
    while held.spent < requests:
        size = ratelimit.lease_size(limit, held)
        held, writes = held._replace(spent=held.spent + size, used=held.used + size), writes + 1
    return writes + 1


def test_warm_model_selection_is_one_read(api, calls):
    tenant = new_tenant()
    path = f"{tenant.app_path}/model-selection"
    assert api.get(path, token=tenant.token).status == 200  # cold: config, prices, token check
    calls.clear()
    for _ in range(WARM_REQUESTS):
        assert api.get(path, token=tenant.token).status == 200
    assert calls["BatchGetItem"] == WARM_REQUESTS  # sticky state + DailyTotals in one call
    assert calls["UpdateItem"] <= leases(WARM_REQUESTS + 1, 120)
    assert set(calls) <= {"BatchGetItem", "UpdateItem"}  # no token, config or price reads


def test_warm_usage_submission_is_one_write_and_one_read(api, calls):
    tenant = new_tenant()
    path = f"{tenant.app_path}/usage"
    assert api.post(path, usage_body(), token=tenant.token).status == 202  # cold: lists the new label-day too
    calls.clear()
    for _ in range(WARM_REQUESTS):
        assert api.post(path, usage_body(), token=tenant.token).status == 202
    # The record is its dedup marker alone: one conditional PutItem (1 write unit), where the
    # shard engine wrote a TransactWriteItems of the marker and a shard ADD (4 write units).
    # The label-day's index entry went with the cold request: this container listed it.
    assert calls["PutItem"] == WARM_REQUESTS
    assert calls["BatchGetItem"] == WARM_REQUESTS  # the label's and the scope's DailyTotal for the response
    assert calls["UpdateItem"] <= leases(WARM_REQUESTS + 1, 1000)
    assert set(calls) <= {"PutItem", "BatchGetItem", "UpdateItem"}  # no transaction
    per_request = sum(calls.values()) / WARM_REQUESTS
    assert per_request <= 2 + leases(WARM_REQUESTS + 1, 1000) / WARM_REQUESTS


def test_a_warm_report_asking_for_the_selection_reads_it_with_its_totals(api, calls):
    """``?model_selection=true`` costs no read of its own: the selection's totals and sticky
    state come in the one BatchGetItem that reads the answer's totals."""
    tenant = new_tenant()
    path = f"{tenant.app_path}/usage"
    assert api.post(path, usage_body(), token=tenant.token).status == 202  # cold
    calls.clear()
    for _ in range(WARM_REQUESTS):
        reply = api.post(path, usage_body(), token=tenant.token, query="model_selection=true")
        assert reply.status == 202 and reply.json()["model_selection"]["recommended_model"]["label"] == "premium"
    assert calls["PutItem"] == WARM_REQUESTS  # the marker alone (was a TransactWriteItems with a shard ADD)
    assert calls["BatchGetItem"] == WARM_REQUESTS
    assert set(calls) <= {"PutItem", "BatchGetItem", "UpdateItem"}


def test_a_new_token_is_checked_against_the_revocation_list_once(api, calls):
    tenant = new_tenant()
    path = f"{tenant.app_path}/model-selection"
    assert api.get(path, token=tenant.token).status == 200
    before = calls["BatchGetItem"]
    assert api.get(path, token=tenant.org_token).status == 200  # another token: one revocation lookup
    assert calls["BatchGetItem"] - before == 2  # the selection read + the new token's check
    calls.clear()
    for _ in range(10):
        assert api.get(path, token=tenant.org_token).status == 200
    assert calls["BatchGetItem"] == 10  # the token's "not revoked" answer is cached


def test_a_cold_containers_report_on_a_config_label_reads_no_profile(api, calls):
    """At fleet shape a container rarely serves an app twice, so its first report is the
    common case (in a container warm for other tenants: prices and the stored config
    labels cached): the token check with the config (its boosts on its items, no Query) in
    one read, a lease, the write and the receipt's totals. A config.yaml label needs no
    profile lookup (registration refuses config labels), so no GetItem. The write is one
    transaction of the record's marker and its new label-day's index entry (the label-day
    has no total yet); no shard ADD."""
    warm = new_tenant()
    assert api.post(f"{warm.app_path}/usage", usage_body(), token=warm.token).status == 202  # prices cached
    tenant = new_tenant()
    calls.clear()
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    assert dict(calls) == {"BatchGetItem": 2, "UpdateItem": 1, "TransactWriteItems": 1}


def test_a_request_naming_an_app_the_org_does_not_have_reads_it_twice_and_no_more(api, calls):
    """Counted and refused in the request pipeline (docs/auth.md, "Rate limits"): the app
    read eventually consistent, then strongly (it may be a moment old), and the 404; the
    org's own config for the limit comes from the token check's read, and the handler is
    never run to read the app a third time (a review found 4 reads a request, 6 cold)."""
    from price_keeper.store import tables

    tenant = new_tenant()
    config_reads = []
    ddb_client().meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem",
        lambda params, **_: config_reads.append(tables.CONFIG.physical_name in params["RequestItems"]),
    )
    path = f"/api/v1/orgs/{tenant.org_id}/apps/ghost-{{}}/model-selection"
    assert api.get(path.format(0), token=tenant.org_token).status == 404  # cold: the token check carries the config
    config_reads.clear()
    for n in range(1, 6):
        assert api.get(path.format(n), token=tenant.org_token).status == 404
    assert sum(config_reads) == 2 * 5


def test_the_config_is_read_eventually_consistent_and_an_item_not_found_again_strongly(aws, monkeypatch):
    """Half the read units on every cold config read (the cache lags changes by 30 s
    anyway); an org or app created a moment ago, which a stale replica may not have yet, is
    read again strongly instead of answered as not registered."""
    from price_keeper.domain import orgs
    from price_keeper.store import config_items, tables

    tenant = new_tenant()
    consistency = []
    ddb_client().meta.events.register(
        "before-parameter-build.dynamodb.BatchGetItem",
        lambda params, **_: consistency.append(params["RequestItems"][tables.CONFIG.physical_name]["ConsistentRead"]),
    )
    orgs.forget(tenant.org_id)
    assert orgs.effective_config(tenant.org_id, tenant.app_id).app_id == tenant.app_id
    assert consistency == [False]

    read = config_items.clients

    def replica_without_the_new_app(pairs, *, consistent=True):
        found = read(pairs, consistent=consistent)
        return found if consistent else {pair: item for pair, item in found.items() if pair[1] is None}

    monkeypatch.setattr(config_items, "clients", replica_without_the_new_app)
    orgs.forget(tenant.org_id)
    consistency.clear()
    assert orgs.effective_config(tenant.org_id, tenant.app_id).app_id == tenant.app_id
    assert consistency == [False, True]
