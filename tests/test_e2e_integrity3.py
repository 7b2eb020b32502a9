"""End to end over real HTTP, round three of the outside review: what it got through
``python -m local``, restarting it for the fold's two findings. See docs/security.md,
"Threats and the tests that cover them"."""

from __future__ import annotations

import dataclasses
import time

import pytest
import requests

from tests.local_server import local_server, module_server
from tests.tenants import new_tenant
from tests.test_e2e_integrity2 import assert_error_bytes, raw_exchange
from tests.test_e2e_ledger import eventually
from tests.usage_support import usage_body, zone_away_from_midnight

KEY = "e2e-integrity3-provisioning-key"
LABELS = ("premium", "standard", "economy")
MODELS = {"premium": "amazon.nova-pro-v1:0", "standard": "amazon.nova-2-lite-v1:0", "economy": "amazon.nova-micro-v1:0"}

pytestmark = pytest.mark.e2e
USAGE = "/api/v1/orgs/00000000-0000-4000-8000-000000000000/apps/web/usage"


base_url = module_server(KEY)


def persisted(tmp_path) -> dict:
    """A server whose state survives a restart, with the sweep an hour away (the stream folds)."""
    return {"LOCAL_PERSIST": "on", "LOCAL_STATE_DIR": str(tmp_path / "state"), "AGGREGATOR_INTERVAL_SECONDS": "3600"}


def report(app_url: str, headers: dict, label: str) -> dict:
    body = usage_body(model_label=label, bedrock_model_id=MODELS[label], input_tokens=1000, output_tokens=100)
    reply = requests.post(f"{app_url}/usage", json=body, headers=headers, timeout=10)
    assert reply.status_code == 202, reply.text
    return {**body, **reply.json()}


def requests_today(app_url: str, headers: dict) -> dict[str, tuple[int, int]]:
    """Each label's (requests, cost) in today's aggregates."""
    reply = requests.get(f"{app_url}/aggregates/today", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return {
        label: (m["requests"], m["cost_usd_micros"]) for label, m in reply.json()["models"].items() if m["requests"]
    }


def test_h1_a_void_folded_again_after_a_restart_leaves_the_fold_running_and_exact(tmp_path):
    """H1: one record, its void, a restart. The replayed stream brought the void's change
    back without the insert before it, the label total's hour mark went negative and its
    encoder looped for ever: nothing was folded again by anyone. Now the shard's progress
    skips what was folded, a negative mark packs like any number, and usage reported after
    the restart is folded."""
    settings = persisted(tmp_path)
    economy = {"economy": 2_000_000}
    with local_server(tmp_path, KEY, **settings) as base:
        zone = zone_away_from_midnight()  # the review's was America/Los_Angeles
        tenant = new_tenant(base, KEY, ["h1"], timezone=zone, model_ordering=["economy"], quotas=economy)
        app_url, headers = tenant.app_path("h1"), tenant.bearer("h1")
        voided = report(app_url, headers, "economy")
        eventually(lambda: requests_today(app_url, headers).get("economy", (0,))[0] == 1, "the record folded")
        reply = requests.post(
            f"{tenant.org_path}/usage/void",
            headers={"X-API-Key": KEY},
            json={"app_id": "h1", "request_ids": [voided["request_id"]], "reason": "outside review H1"},
            timeout=10,
        )
        assert reply.status_code == 200 and reply.json()["voided"] == 1, reply.text
        eventually(lambda: "economy" not in requests_today(app_url, headers), "the void folded")
    app_path = app_url.removeprefix(base)
    with local_server(tmp_path, KEY, **settings) as base:
        app_url, headers = base + app_path, dataclasses.replace(tenant, base_url=base).bearer("h1")
        kept = report(app_url, headers, "economy")
        wanted = {"economy": (1, kept["processing"]["cost_usd_micros"])}
        eventually(lambda: requests_today(app_url, headers) == wanted, f"after the restart only {wanted}")
        assert requests.get(f"{base}/health", timeout=5).status_code == 200


def test_h2_a_restart_that_batches_the_stream_otherwise_counts_each_record_once(tmp_path):
    """H2: 21 label-days (7 apps x 3 labels) reported in two deliveries, then a restart that
    replays the whole stream as one batch: its chunks were cut differently from the first
    deliveries', and 21 records showed as 23. Counted by the shard's progress, not by
    chunks, it is 21 however the replay is cut."""
    settings = persisted(tmp_path)
    apps = [f"app-{n}" for n in range(7)]
    with local_server(tmp_path, KEY, **settings) as base:
        tenant = new_tenant(
            base,
            KEY,
            apps,
            timezone=zone_away_from_midnight(),
            model_ordering=list(LABELS),
            quotas=dict.fromkeys(LABELS, 10**9),
        )
        headers = {app: tenant.bearer(app) for app in apps}
        pairs = [(app, label) for app in apps for label in LABELS]
        costs: dict[str, int] = {}
        for start, end in ((0, 10), (10, 21)):
            for app, label in pairs[start:end]:
                costs[app] = (
                    costs.get(app, 0)
                    + report(tenant.app_path(app), headers[app], label)["processing"]["cost_usd_micros"]
                )
            time.sleep(4)  # a delivery of its own, as the review's were

        def counted() -> int:
            return sum(
                requests for app in apps for requests, _ in requests_today(tenant.app_path(app), headers[app]).values()
            )

        eventually(lambda: counted() == 21, "all 21 folded before the restart")
    with local_server(tmp_path, KEY, **settings) as base:
        again = dataclasses.replace(tenant, base_url=base)
        headers = {app: again.bearer(app) for app in apps}
        app_path = again.app_path
        extra = report(app_path("app-0"), headers["app-0"], "premium")
        costs["app-0"] += extra["processing"]["cost_usd_micros"]

        def per_app() -> dict[str, tuple[int, int]]:
            today = {app: requests_today(app_path(app), headers[app]).values() for app in apps}
            return {app: (sum(r for r, _ in rows), sum(c for _, c in rows)) for app, rows in today.items()}

        wanted = {app: (3 + (app == "app-0"), costs[app]) for app in apps}
        eventually(lambda: per_app() == wanted, "22 records after the restart, each once")
        time.sleep(2)  # a replay that counted twice would show by now
        assert per_app() == wanted


# --- M1: the body limit holds whatever Content-Length says --------------------------------


@pytest.mark.parametrize(
    ("length_headers", "status"),
    [
        ("Content-Length: -1\r\n", 400),  # read to the end of the stream: 150 MB held
        ("Content-Length: abc\r\n", 400),  # raised: the connection dropped with no reply
        ("Content-Length: +5\r\n", 400),
        ("Content-Length: 5\r\nContent-Length: 7\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", 411),  # a body this server would not read
        ("Content-Length: 1000001\r\n", 413),
    ],
    ids=["negative", "not-a-number", "signed", "two-lengths", "chunked", "one-past-the-limit"],
)
def test_m1_a_body_length_that_is_not_one_number_within_the_limit_is_refused(base_url, length_headers, status):
    head = f"POST {USAGE} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{length_headers}\r\n"
    body = assert_error_bytes(*raw_exchange(base_url, head.encode() + b"{}"), status)
    assert body["error"] == "INVALID_REQUEST"
    assert requests.get(f"{base_url}/health", timeout=5).status_code == 200  # and the server still serves


# --- M4: one app cannot hold an ORG scope's headroom ---------------------------------------


def test_m4_an_app_holds_at_most_its_share_and_its_siblings_reserve_and_select_as_holds_allow(base_url):
    """Outside review M4: in ORG scope one app held 2,999,997 of 3,000,000 with free
    reservations, renewable for an hour; its siblings got 429 while their selection said
    NORMAL, 0 %. Now an app's live holds stay within half the scope's headroom (config
    ``metering.app_hold_share_pct``), the hog alone is refused past it, and a sibling's
    selection counts the holds: premium, filled by holds, is not offered, as a reservation
    would not be granted it."""
    call = {"max_input_tokens": 1000, "max_output_tokens": 1000, "ttl_secs": 3600}  # premium 4,000, standard 3,080
    tenant = new_tenant(
        base_url,
        KEY,
        ["hog", "web"],
        quota_scope="ORG",
        timezone=zone_away_from_midnight(),
        model_ordering=["premium", "standard"],
        quotas={"premium": 20_000, "standard": 10**9},
        total_quota_usd_micros=100_000,
    )
    hog, web = (requests.Session() for _ in range(2))
    hog.headers.update(tenant.bearer("hog"))
    web.headers.update(tenant.bearer("web"))
    held = []
    for _ in range(40):
        reply = hog.post(f"{tenant.app_path('hog')}/reservations", json=call, timeout=10)
        if reply.status_code == 429:
            assert reply.json()["error"] == "QUOTA_EXCEEDED"
            break
        assert reply.status_code == 201, reply.text
        held.append((reply.json()["label"], reply.json()["amount_usd_micros"]))
    else:
        pytest.fail("the hog was never refused")
    assert sum(amount for _, amount in held) <= 50_000  # half the headroom of 100,000
    assert [label for label, _ in held] == ["premium"] * 5 + ["standard"] * 9  # 20,000 + 27,720
    selected = web.get(f"{tenant.app_path('web')}/model-selection", timeout=10)
    assert selected.status_code == 200, selected.text
    status = selected.json()["quota_status"]
    assert selected.json()["recommended_model"]["label"] == "standard"  # premium's quota is all held
    assert status["models_status"]["premium"]["reserved_usd_micros"] == 20_000
    assert status["total"]["reserved_usd_micros"] == sum(amount for _, amount in held)
    sibling = web.post(f"{tenant.app_path('web')}/reservations", json=call, timeout=10)
    assert sibling.status_code == 201 and sibling.json()["label"] == "standard", sibling.text
    aggregates = requests.get(f"{tenant.org_path}/aggregates/today", headers=tenant.bearer(), timeout=10)
    assert aggregates.status_code == 200, aggregates.text
    assert aggregates.json()["total_reserved_usd_micros"] == sum(amount for _, amount in held) + 3080
