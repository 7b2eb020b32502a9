"""GET /api/v1/orgs/{org_id}/reports/spend: rows per day x app x label from DailyTotal (one
Query per usage key), CSV, DST days, range rules, tenant isolation and token rules."""

import csv
import io
import time
import uuid
from collections import Counter
from datetime import date, timedelta

import pytest

from price_keeper.domain import reports
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import ddb_client, table
from price_keeper.store.usage import COUNTERS  # the counters a DailyTotal holds
from price_keeper.timeutil import day_start_utc, org_date, org_day
from tests.conftest import assert_error
from tests.factories import seed_app, seed_org, token_for
from tests.usage_support import fold_usage, put_records, usage_body


def seed_total(scope: str, label: str, day: str, **values) -> dict:
    """A DailyTotal item in the shape the aggregator writes; counters default to a day-derived value."""
    base = int(day[-2:])
    item = {
        "usage_key": keys.usage_key(scope, label),
        "date_key": keys.day_key(day),
        **{name: values.get(name, base * (i + 1)) for i, name in enumerate(COUNTERS)},
        "updated_at_epoch": int(time.time()),
    }
    table(tables.DAILY_TOTAL).put_item(Item=item)
    return item


def report(api, org_id, token, **query):
    return api.get(
        f"/api/v1/orgs/{org_id}/reports/spend",
        token=token,
        query="&".join(f"{name}={value}" for name, value in query.items()),
    )


def row(day: str, app_id, label: str, item: dict) -> dict:
    return {
        "date": f"{day[:4]}-{day[4:6]}-{day[6:]}",
        "app_id": app_id,
        "label": label,
        **{name: int(item[name]) for name in COUNTERS},
    }


@pytest.fixture
def app_org(aws):
    """APP-scoped org: app-1 inherits [premium, standard, economy], app-2 orders [standard] only."""
    org_id = seed_org(quota_scope="APP")
    seed_app(org_id, "app-1")
    seed_app(org_id, "app-2", model_ordering=["standard"], quotas={"standard": 1})
    return org_id


def scope(org_id, app_id=None):
    return keys.scope_key(org_id, app_id, "APP" if app_id else "ORG")


# --- rows ------------------------------------------------------------------------------


def test_rows_per_day_app_and_label_sorted_with_exact_columns(api, app_org):
    a1, a2 = scope(app_org, "app-1"), scope(app_org, "app-2")
    seeded = {
        ("20261002", "app-1", "economy"): seed_total(a1, "economy", "20261002"),
        ("20261001", "app-1", "premium"): seed_total(a1, "premium", "20261001", cache_read_input_tokens=0),
        ("20261001", "app-2", "standard"): seed_total(a2, "standard", "20261001"),
        ("20261001", "app-1", "standard"): seed_total(a1, "standard", "20261001"),
        # not in app-2's ordering, but a config label: its total is read apart, and reported
        ("20261001", "app-2", "premium"): seed_total(a2, "premium", "20261001"),
    }
    seed_total(a1, "premium", "20260930")  # the day before the range
    seed_total(a1, "premium", "20261003")  # the day after it
    reply = report(api, app_org, token_for(app_org), **{"from": "2026-10-01", "to": "2026-10-02"})
    assert reply.status == 200, reply
    rows = reply.json()["rows"]
    assert all(list(r) == list(reports.COLUMNS) for r in rows)
    assert rows == [
        row("20261001", "app-1", "premium", seeded[("20261001", "app-1", "premium")]),
        row("20261001", "app-1", "standard", seeded[("20261001", "app-1", "standard")]),
        row("20261001", "app-2", "standard", seeded[("20261001", "app-2", "standard")]),
        row("20261001", "app-2", "premium", seeded[("20261001", "app-2", "premium")]),
        row("20261002", "app-1", "economy", seeded[("20261002", "app-1", "economy")]),
    ]


def test_items_without_cache_counters_report_zero(api, app_org):
    table(tables.DAILY_TOTAL).put_item(
        Item={
            "usage_key": keys.usage_key(scope(app_org, "app-1"), "premium"),
            "date_key": "DAY#20261005",
            "cost_usd_micros": 5,
            "input_tokens": 6,
            "output_tokens": 7,
            "requests": 1,
            "updated_at_epoch": 1,
        }
    )
    rows = report(api, app_org, token_for(app_org), **{"from": "2026-10-05", "to": "2026-10-05"}).json()["rows"]
    assert rows == [
        {
            "date": "2026-10-05",
            "app_id": "app-1",
            "label": "premium",
            "cost_usd_micros": 5,
            "input_tokens": 6,
            "output_tokens": 7,
            "cache_read_input_tokens": 0,
            "cache_write_input_tokens": 0,
            "requests": 1,
        }
    ]


def test_org_scoped_org_reports_the_org_scope_with_null_app(api):
    org_id = seed_org(quota_scope="ORG", model_ordering=("premium", "economy"))
    seed_app(org_id, "app-1")
    item = seed_total(scope(org_id), "economy", "20261010")
    seed_total(keys.scope_key(org_id, "app-1", "APP"), "economy", "20261010")  # not an ORG-scope key
    expected = [row("20261010", None, "economy", item)]
    assert (
        report(api, org_id, token_for(org_id), **{"from": "2026-10-10", "to": "2026-10-10"}).json()["rows"] == expected
    )
    # an app of an ORG-scoped org shares the org's quota: its own token sees the org's rows
    assert (
        report(
            api, org_id, token_for(org_id, "app-1"), **{"from": "2026-10-10", "to": "2026-10-10", "app_id": "app-1"}
        ).json()["rows"]
        == expected
    )


def test_one_query_per_usage_key_and_never_a_scan(api, app_org):
    calls = Counter()

    def count(model, params, **_):
        calls[(model.name, params.get("TableName"))] += 1

    ddb_client().meta.events.register("before-parameter-build.dynamodb", count)
    try:
        assert report(api, app_org, token_for(app_org), **{"from": "2026-07-01", "to": "2026-09-30"}).status == 200
    finally:
        ddb_client().meta.events.unregister("before-parameter-build.dynamodb", count)
    # each app x config.yaml's 4 labels (its ordering's, and the others' totals, read apart from
    # the scope total), and each app scope's total (which names any other label: a profile)
    assert calls[("Query", tables.DAILY_TOTAL.physical_name)] == 2 * 4 + 2
    assert calls[("Query", tables.CONFIG.physical_name)] == 1  # the org's apps
    assert not [call for call in calls if call[0] == "Scan"]


# --- DST days ------------------------------------------------------------------------------


@pytest.mark.parametrize("day, hours", [(date(2026, 3, 8), 23), (date(2026, 11, 1), 25)])
def test_dst_day_is_one_row_per_day(api, day, hours):
    tz = "America/New_York"
    org_id = seed_org(quota_scope="ORG", timezone=tz, model_ordering=("premium",))
    start, end = day_start_utc(tz, day), day_start_utc(tz, day + timedelta(days=1))
    assert end - start == timedelta(hours=hours)
    # one request every local hour from the day before to the day after, keyed as metering keys them
    per_day = Counter(org_day(tz, start + timedelta(hours=h)) for h in range(-24, hours + 24))
    for day_key, requests in per_day.items():
        seed_total(scope(org_id), "premium", day_key, requests=requests, cost_usd_micros=requests * 10)
    before, after = (day - timedelta(days=1)).isoformat(), (day + timedelta(days=1)).isoformat()
    rows = report(api, org_id, token_for(org_id), **{"from": before, "to": after}).json()["rows"]
    assert [(r["date"], r["requests"]) for r in rows] == [(before, 24), (day.isoformat(), hours), (after, 24)]


# --- CSV ---------------------------------------------------------------------------------


def test_csv_has_the_same_rows_and_columns_as_json(api, app_org):
    for day in ("20261001", "20261002"):
        seed_total(scope(app_org, "app-1"), "premium", day)
        seed_total(scope(app_org, "app-2"), "standard", day)
    query = {"from": "2026-10-01", "to": "2026-10-02"}
    as_json = report(api, app_org, token_for(app_org), **query).json()["rows"]
    reply = report(api, app_org, token_for(app_org), format="csv", **query)
    assert reply.status == 200, reply
    assert reply.headers["content-type"].startswith("text/csv")
    assert f'filename="spend-{app_org}-2026-10-01-2026-10-02.csv"' in reply.headers["content-disposition"]
    lines = reply.text.split("\r\n")
    assert lines[0] == ",".join(reports.COLUMNS) and lines[-1] == ""
    parsed = [
        {name: (int(value) if name in COUNTERS else value or None) for name, value in r.items()}
        for r in csv.DictReader(io.StringIO(reply.text))
    ]
    assert len(as_json) == 4 and parsed == as_json


def test_csv_of_an_empty_report_is_the_header_row(api, app_org):
    reply = report(api, app_org, token_for(app_org), format="csv", **{"from": "2026-10-01", "to": "2026-10-01"})
    assert reply.text == ",".join(reports.COLUMNS) + "\r\n"


# --- range and parameter errors ----------------------------------------------------------


def test_92_days_is_the_longest_range(api, app_org):
    first = date(2026, 1, 1)
    ok = report(
        api, app_org, token_for(app_org), **{"from": first.isoformat(), "to": (first + timedelta(days=91)).isoformat()}
    )
    assert ok.status == 200, ok
    error = assert_error(
        report(
            api,
            app_org,
            token_for(app_org),
            **{"from": first.isoformat(), "to": (first + timedelta(days=92)).isoformat()},
        ),
        400,
        "INVALID_REQUEST",
    )
    assert error["details"]["max_days"] == 92


@pytest.mark.parametrize(
    "query",
    [
        {"from": "2026-10-02", "to": "2026-10-01"},  # from after to
        {"from": "2026-13-45", "to": "2026-10-01"},
        {"from": "20261001", "to": "2026-10-01"},
        {"from": "2026-10-01", "to": "2026-10-1"},
        {"from": "2026-02-30", "to": "2026-03-01"},
        {"to": "2026-10-01"},
        {"from": "2026-10-01"},
        {"from": "2026-10-01", "to": "2026-10-01", "format": "xml"},
        {"from": "2026-10-01", "to": "2026-10-01", "app_id": "bad%23id"},
    ],
)
def test_bad_dates_ranges_and_parameters_are_400(api, app_org, query):
    assert_error(report(api, app_org, token_for(app_org), **query), 400, "INVALID_REQUEST")


def test_unknown_app_is_404(api, app_org):
    assert_error(
        report(api, app_org, token_for(app_org), **{"from": "2026-10-01", "to": "2026-10-01", "app_id": "app-404"}),
        404,
        "NOT_FOUND",
    )


# --- tenants and tokens ----------------------------------------------------------------------


def test_another_orgs_totals_never_appear(api, app_org):
    other = seed_org(quota_scope="APP")
    seed_app(other, "app-1")
    seed_total(scope(other, "app-1"), "premium", "20261001")  # same app id and label, other org
    seed_total(scope(other), "premium", "20261001")
    mine = seed_total(scope(app_org, "app-1"), "premium", "20261001", cost_usd_micros=1)
    rows = report(api, app_org, token_for(app_org), **{"from": "2026-10-01", "to": "2026-10-01"}).json()["rows"]
    assert rows == [row("20261001", "app-1", "premium", mine)]
    # and the other org's token cannot read this org's report
    assert_error(report(api, app_org, token_for(other), **{"from": "2026-10-01", "to": "2026-10-01"}), 403, "FORBIDDEN")


def test_app_token_reads_only_its_own_app(api, app_org):
    mine = seed_total(scope(app_org, "app-1"), "premium", "20261001")
    seed_total(scope(app_org, "app-2"), "standard", "20261001")
    token = token_for(app_org, "app-1")
    window = {"from": "2026-10-01", "to": "2026-10-01"}
    assert_error(report(api, app_org, token, **window), 403, "FORBIDDEN")  # no app_id: the whole org
    assert_error(report(api, app_org, token, app_id="app-2", **window), 403, "FORBIDDEN")
    reply = report(api, app_org, token, app_id="app-1", **window)
    assert reply.status == 200, reply
    assert reply.json()["rows"] == [row("20261001", "app-1", "premium", mine)]


def test_org_token_may_narrow_to_one_app(api, app_org):
    seed_total(scope(app_org, "app-1"), "premium", "20261001")
    only = seed_total(scope(app_org, "app-2"), "standard", "20261001")
    rows = report(
        api, app_org, token_for(app_org), app_id="app-2", **{"from": "2026-10-01", "to": "2026-10-01"}
    ).json()["rows"]
    assert rows == [row("20261001", "app-2", "standard", only)]


def test_missing_token_is_401(api, app_org):
    assert_error(report(api, app_org, None, **{"from": "2026-10-01", "to": "2026-10-01"}), 401, "UNAUTHORIZED")


def test_unknown_org_is_404(api):
    org_id = str(uuid.uuid4())
    assert_error(report(api, org_id, token_for(org_id), **{"from": "2026-10-01", "to": "2026-10-01"}), 404, "NOT_FOUND")


@pytest.fixture
def label_lookups(aws) -> list[str]:
    """The scopes whose spent-label items a request Queried."""
    lookups = []

    def count(params, **_):
        values = params.get("ExpressionAttributeValues", {})
        lookups.extend(value for value in values.values() if isinstance(value, str) and value.endswith("#LABELS"))

    ddb_client().meta.events.register("provide-client-params.dynamodb.Query", count)
    return lookups


def shown(api, org_id: str, app_id: str) -> tuple[set[str], set[str]]:
    """The labels of today's aggregates of the app, and of today's spend report of the org."""
    today = org_date("America/New_York").isoformat()
    models = api.get(f"/api/v1/orgs/{org_id}/apps/{app_id}/aggregates/today", token=token_for(org_id, app_id))
    rows = report(api, org_id, token_for(org_id), **{"from": today, "to": today}).json()["rows"]
    return set(models.json()["models"]), {row["label"] for row in rows if row["app_id"] == app_id}


def test_a_profile_label_is_listed_apart_and_looked_up_only_when_the_ordering_does_not_account_for_it(
    api, app_org, label_lookups
):
    """Config labels are listed in the scope total's set (bounded by config.yaml); any other
    label (a profile) in an item of its own, which the scope total counts: a report or
    aggregates answer Queries those items only when its ordering's folded labels fall short."""
    token, path = token_for(app_org, "app-1"), f"/api/v1/orgs/{app_org}/apps/app-1"
    for label in ("premium", "standard", "ultra_premium"):  # ultra_premium: in config.yaml, not in the ordering
        assert api.post(f"{path}/usage", usage_body(model_label=label), token=token).status == 202
    fold_usage()
    models, rows = shown(api, app_org, "app-1")
    assert ("ultra_premium" in models, {"premium", "standard", "ultra_premium"} <= rows, label_lookups) == (
        True,
        True,
        [],
    )
    day = org_day("America/New_York")
    put_records(scope(app_org, "app-1"), "my-profile", day=day, cost=40)
    fold_usage()
    models, rows = shown(api, app_org, "app-1")
    assert "my-profile" in models and "my-profile" in rows
    assert label_lookups == [keys.spent_labels_key(scope(app_org, "app-1"))] * 2  # one for each answer


def test_spend_on_a_label_outside_the_ordering_is_reported(api, app_org):
    """app-2 orders [standard] only; its calls on premium count and show, as in aggregates."""
    reply = api.post(
        f"/api/v1/orgs/{app_org}/apps/app-2/usage", usage_body(model_label="premium"), token=token_for(app_org, "app-2")
    )
    assert reply.status == 202, reply
    fold_usage()
    today = org_date("America/New_York").isoformat()
    rows = report(api, app_org, token_for(app_org), **{"from": today, "to": today}).json()["rows"]
    assert [(r["app_id"], r["label"], r["cost_usd_micros"], r["requests"]) for r in rows] == [
        ("app-2", "premium", 3760, 1)
    ]


@pytest.mark.slow  # volume: hundreds of calls; make test and CI run it
def test_labels_outside_the_ordering_count_toward_what_one_report_may_read(api, app_org):
    """The ordering's keys are checked before any read; profile labels (up to 400 a scope)
    are only known from the totals, and a report with them reads and answers at most
    ``MAX_USAGE_KEYS`` x ``MAX_DAYS`` key-days (red-team note: 400 profiles made a 92-day
    report 400 Queries and a reply past Lambda's 6 MB)."""
    day = org_day("America/New_York")
    app_scope = scope(app_org, "app-2")  # config.yaml's 4 labels, and the scope total
    profiles = [f"profile-{n:03d}" for n in range(200)]
    for label in profiles:
        put_records(app_scope, label, day=day, cost=1)
    fold_usage()
    token, today = token_for(app_org, "app-2"), date.fromisoformat(f"{day[:4]}-{day[4:6]}-{day[6:]}")
    longest = {"from": (today - timedelta(days=reports.MAX_DAYS - 1)).isoformat(), "to": today.isoformat()}
    details = assert_error(report(api, app_org, token, app_id="app-2", **longest), 400, "INVALID_REQUEST")["details"]
    assert details == {
        "usage_keys": 204,
        "days": 92,
        "max_usage_key_days": reports.MAX_USAGE_KEYS * reports.MAX_DAYS,
        "max_usage_keys": reports.MAX_QUERIES,
    }
    one_day = report(api, app_org, token, app_id="app-2", **{"from": today.isoformat(), "to": today.isoformat()})
    assert one_day.status == 200 and {row["label"] for row in one_day.json()["rows"]} == set(profiles)


def test_a_report_reads_at_most_max_queries_keys_even_for_one_day(api, app_org, monkeypatch):
    day = org_day("America/New_York")
    app_scope = scope(app_org, "app-2")  # config.yaml's 4 labels and 5 profiles: 9 keys to Query
    for n in range(5):
        put_records(app_scope, f"profile-{n}", day=day, cost=1)
    fold_usage()
    token, today = token_for(app_org, "app-2"), f"{day[:4]}-{day[4:6]}-{day[6:]}"
    one_day = {"app_id": "app-2", "from": today, "to": today}
    monkeypatch.setattr(reports, "MAX_QUERIES", 8)
    details = assert_error(report(api, app_org, token, **one_day), 400, "INVALID_REQUEST")["details"]
    assert (details["usage_keys"], details["max_usage_keys"]) == (9, 8)
    monkeypatch.setattr(reports, "MAX_QUERIES", 9)
    assert report(api, app_org, token, **one_day).status == 200
