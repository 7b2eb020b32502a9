"""End to end over real HTTP, round two of the outside review: what an app token,
a hostile caller and light concurrency still got around, each against ``python -m local``.
See docs/security.md, "Threats and the tests that cover them"."""

from __future__ import annotations

import concurrent.futures
import http.client
import socket
import time
import uuid
from datetime import date
from urllib.parse import urlparse

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.local_server import local_server, module_server
from tests.tenants import new_tenant
from tests.usage_support import usage_body

KEY = "e2e-integrity2-provisioning-key"
WAIT_SECONDS = 30
QUOTAS = {"premium": 1_000_000_000, "standard": 5_000_000_000}
ERROR_KEYS = {"error", "message", "timestamp"}

pytestmark = pytest.mark.e2e


base_url = module_server(KEY, AGGREGATOR_INTERVAL_SECONDS="1")


class Org:
    """An APP-scoped org with the apps "web" and "batch", their tokens and the org's, over HTTP."""

    def __init__(self, base_url: str):
        tenant = new_tenant(base_url, KEY, ["web", "batch"], model_ordering=list(QUOTAS), quotas=QUOTAS)
        self.org_id, self.path, self.credentials = tenant.org_id, tenant.org_path, tenant.credentials
        self.bearer = {app_id: tenant.bearer(app_id) for app_id in self.credentials}

    def get(self, path: str, as_app: str | None = None, **params) -> requests.Response:
        return requests.get(f"{self.path}/{path}", params=params, headers=self.bearer[as_app], timeout=10)


def record(request_id: str | None = None) -> dict:
    return usage_body(request_id, model_label="standard", input_tokens=100, output_tokens=10)


def assert_error(reply: requests.Response, status: int) -> dict:
    """The reply is ``status`` with a body in api_spec.md's error schema."""
    assert reply.status_code == status, reply.text
    assert reply.headers["Content-Type"].startswith("application/json"), reply.headers
    body = reply.json()
    assert ERROR_KEYS <= set(body), body
    return body


# --- 1: the query is no credential -------------------------------------------------------


@pytest.mark.parametrize("path", ["alerts", "aggregates/today", f"aggregates/{date.today().isoformat()}"])
def test_an_app_token_naming_its_own_app_in_the_query_still_cannot_read_org_data(base_url, path):
    org = Org(base_url)
    assert org.get(path).status_code in (200, 404)  # the org token may (404: no data that day yet)
    assert_error(org.get(path, "web"), 403)
    assert_error(org.get(path, "web", app_id="web"), 403)
    assert_error(org.get(path, "web", app_id="batch"), 403)


def test_the_spend_report_alone_takes_the_app_from_the_query(base_url):
    org = Org(base_url)
    today = date.today().isoformat()
    assert org.get("reports/spend", "web", **{"from": today, "to": today, "app_id": "web"}).status_code == 200
    assert_error(org.get("reports/spend", "web", **{"from": today, "to": today, "app_id": "batch"}), 403)
    assert_error(org.get("reports/spend", "web", **{"from": today, "to": today}), 403)
    assert org.get("reports/spend", **{"from": today, "to": today}).status_code == 200


# --- 9: dates at the calendar's edges ------------------------------------------------------

EDGE_DATES = ["0001-01-01", "0001-01-02", "0999-12-31", "1000-01-01", "9999-12-30", "9999-12-31"]


@pytest.fixture(scope="module")
def dated_org(base_url) -> Org:
    return Org(base_url)


def assert_answered(reply: requests.Response) -> None:
    """Any answer but a server error; an error in the error schema."""
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert_error(reply, reply.status_code)


@pytest.mark.parametrize("day", EDGE_DATES)
def test_dates_at_the_calendars_edges_are_400(dated_org, day):
    org = dated_org
    assert_error(org.get("alerts", date=day), 400)
    assert_error(org.get(f"aggregates/{day}"), 400)
    assert_error(org.get(f"apps/web/aggregates/{day}"), 400)
    assert_error(org.get("reports/spend", **{"from": day, "to": day}), 400)
    assert_error(org.get("reports/spend", **{"from": "2026-01-01", "to": day}), 400)


@pytest.mark.parametrize(
    "expires_at",
    [
        "0001-01-01T00:00:00+14:00",
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00-14:00",
        "9999-12-31T23:59:59-14:00",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59+14:00",
    ],
)
def test_boost_expiries_at_the_calendars_edges_are_400(dated_org, expires_at):
    reply = requests.post(
        f"{dated_org.path}/quota-boosts",
        headers={"X-API-Key": KEY},
        json={"model_label": "standard", "amount_usd_micros": 1, "expires_at": expires_at, "app_id": "web"},
        timeout=10,
    )
    assert_error(reply, 400)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(day=st.dates(), offset_minutes=st.integers(-14 * 60, 14 * 60))
def test_no_date_anywhere_is_a_server_error(dated_org, day, offset_minutes):
    org, text = dated_org, day.isoformat()
    assert_answered(org.get("alerts", date=text))
    assert_answered(org.get(f"aggregates/{text}"))
    assert_answered(org.get("reports/spend", **{"from": text, "to": text}))
    sign, minutes = "+" if offset_minutes >= 0 else "-", abs(offset_minutes)
    stamp = f"{text}T12:00:00{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    boost = requests.post(
        f"{org.path}/quota-boosts",
        headers={"X-API-Key": KEY},
        json={"model_label": "standard", "amount_usd_micros": 1, "expires_at": stamp, "app_id": "web"},
        timeout=10,
    )
    assert_answered(boost)
    usage = requests.post(
        f"{org.path}/apps/web/usage", headers=org.bearer["web"], json={**record(), "timestamp": stamp}, timeout=10
    )
    assert_answered(usage)


# --- 13: the local server's own errors -----------------------------------------------------


def raw_exchange(base_url: str, data: bytes) -> tuple[int, dict, bytes]:
    """Send ``data`` as it is and read the one response (status, headers, body)."""
    address = urlparse(base_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(data)
        response = http.client.HTTPResponse(connection)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def assert_error_bytes(status: int, headers: dict, body: bytes, expected: int) -> dict:
    import json

    assert status == expected, body
    assert headers["content-type"].startswith("application/json"), headers
    parsed = json.loads(body)
    assert ERROR_KEYS <= set(parsed), parsed
    return parsed


def test_an_oversized_body_is_413_in_the_error_schema(base_url):
    head = (
        "POST /api/v1/orgs/00000000-0000-4000-8000-000000000000/apps/web/usage HTTP/1.1\r\n"
        "Host: localhost\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n"
    )
    body = assert_error_bytes(*raw_exchange(base_url, head.encode()), 413)
    assert body["error"] == "INVALID_REQUEST" and body["details"] == {"max_body_bytes": 1_000_000}


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),  # no method, path and version
        (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(120)) + b"\r\n", 431),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ],
    ids=["no-request-line", "four-words", "http-9.9", "too-many-headers", "uri-too-long"],
)
def test_a_malformed_request_is_answered_in_the_error_schema(base_url, request_bytes, status):
    body = assert_error_bytes(*raw_exchange(base_url, request_bytes), status)
    assert body["error"] == ("INTERNAL_ERROR" if status >= 500 else "INVALID_REQUEST")


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/nope", 404), ("BREW", "/health", 405)])
def test_unknown_paths_and_methods_are_answered_in_the_error_schema(base_url, method, path, status):
    assert_error(requests.request(method, f"{base_url}{path}", timeout=10), status)


# --- 12: light concurrency never 500s, and nothing accepted is lost -----------------------


def test_concurrent_reports_with_duplicates_are_never_a_500_and_count_each_record_once(base_url):
    """Single and batch reports of two apps at once, a third of them resent: moto's
    transaction rollback used to iterate a table another request was changing (a 500),
    and to swap back a copy of the table taken before another request's write (a lost record)."""
    org = Org(base_url)
    request_ids = {app_id: [str(uuid.uuid4()) for _ in range(60)] for app_id in ("web", "batch")}

    def singles(app_id: str, part: int) -> list[int]:
        with requests.Session() as session:
            return [
                session.post(
                    f"{org.path}/apps/{app_id}/usage", json=record(request_id), headers=org.bearer[app_id], timeout=30
                ).status_code
                for request_id in request_ids[app_id][part * 20 : part * 20 + 30]  # overlaps the next part by 10
            ]

    def batches(app_id: str) -> list[int]:
        with requests.Session() as session:
            return [
                session.post(
                    f"{org.path}/apps/{app_id}/usage/batch",
                    json={"requests": [record(request_id) for request_id in request_ids[app_id][first : first + 15]]},
                    headers=org.bearer[app_id],
                    timeout=30,
                ).status_code
                for first in range(0, 60, 15)
            ]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(singles, app_id, part) for app_id in ("web", "batch") for part in (0, 1, 2)]
        jobs += [pool.submit(batches, app_id) for app_id in ("web", "batch")]
        statuses = [status for job in jobs for status in job.result()]
    assert sorted(set(statuses)) == [202, 207], statuses

    def counted(app_id: str) -> int:
        reply = org.get(f"apps/{app_id}/aggregates/today", app_id)
        return reply.json()["models"]["standard"]["requests"] if reply.status_code == 200 else -1

    deadline = time.monotonic() + WAIT_SECONDS
    while (found := {app_id: counted(app_id) for app_id in request_ids}) != {"web": 60, "batch": 60}:
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


# --- 14: tokens per client id --------------------------------------------------------------


def test_a_client_gets_ten_tokens_a_minute_and_then_429_with_retry_after(tmp_path):
    with local_server(tmp_path, KEY, RATE_LIMITS="on") as url:
        if time.time() % 60 > 30:  # the limit counts per minute: start with half a minute to go, at least
            time.sleep(60.5 - time.time() % 60)
        org = Org(url)  # three tokens issued: the org's and its two apps'
        web = {**org.credentials["web"], "grant_type": "client_credentials"}
        form = {**web}
        statuses = [requests.post(f"{url}/auth/token", json=web, timeout=10).status_code for _ in range(6)]
        statuses += [requests.post(f"{url}/auth/token", data=form, timeout=10).status_code for _ in range(3)]
        assert statuses == [200] * 9  # with the one Org() took: ten, JSON and OAuth2 forms alike
        refused = requests.post(f"{url}/auth/token", json=web, timeout=10)
        body = assert_error(refused, 429)
        assert body["error"] == "RATE_LIMIT_EXCEEDED"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["X-RateLimit-ClientId"] == org.credentials["web"]["client_id"]
        form_refused = requests.post(f"{url}/auth/token", data=form, timeout=10)
        assert form_refused.status_code == 429 and "Retry-After" in form_refused.headers
        # another client of the same org, from the same address, is not limited by it
        assert (
            requests.post(
                f"{url}/auth/token", json={**org.credentials["batch"], "grant_type": "client_credentials"}, timeout=10
            ).status_code
            == 200
        )
        # a wrong secret is still a failed attempt (401), not a token request
        wrong = requests.post(f"{url}/auth/token", json={**web, "client_secret": "wrong"}, timeout=10)
        assert_error(wrong, 401)


def test_batch_records_that_settle_a_hold_are_charged_to_the_single_reports_limit(tmp_path):
    """A batch record naming a reservation is a transaction of its own, as a single report
    is, so it spends the client's ``usage`` limit: past it, each such record fails alone
    with ``RATE_LIMIT_EXCEEDED`` in the 207, while the batch's other records are counted."""
    with local_server(tmp_path, KEY, RATE_LIMITS="on") as url:
        if time.time() % 60 > 30:  # the limit counts per minute: start with half a minute to go, at least
            time.sleep(60.5 - time.time() % 60)
        overrides = {"rate_limits": {"usage": 2}}
        tenant = new_tenant(
            url, KEY, ["web"], model_ordering=["standard"], quotas={"standard": 10**9}, overrides=overrides
        )
        headers = tenant.bearer("web")
        holds = [
            requests.post(
                f"{tenant.app_path('web')}/reservations",
                json={"model_label": "standard", "max_input_tokens": 100, "max_output_tokens": 100},
                headers=headers,
                timeout=10,
            )
            for _ in range(3)
        ]
        assert [hold.status_code for hold in holds] == [201] * 3, holds[0].text
        settling = [usage_body(model_label="standard", reservation_id=hold.json()["reservation_id"]) for hold in holds]
        plain = [usage_body(model_label="standard") for _ in range(3)]
        reply = requests.post(
            f"{tenant.app_path('web')}/usage/batch", json={"requests": [*plain, *settling]}, headers=headers, timeout=10
        )
        assert reply.status_code == 207, reply.text
        outcomes = [result.get("error", result["status"]) for result in reply.json()["results"]]
        assert outcomes == ["accepted"] * 5 + ["RATE_LIMIT_EXCEEDED"]
