"""Usage metering through the real handlers on moto: the 202/207 bodies, every error the
spec lists (with nothing written), exactly-once under retries and races, and item sizes
that stay constant at any daily volume."""

from __future__ import annotations

import copy
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from botocore.stub import Stubber

from price_keeper.bodies import UsageRequest
from price_keeper.domain import metering, orgs
from price_keeper.store import daily_totals, keys, tables, usage
from price_keeper.store.dynamo import ddb_client, item_size
from price_keeper.timeutil import day_start_utc, org_date, org_day
from tests.conftest import assert_error
from tests.factories import token_for
from tests.usage_support import (
    all_items,
    daily_total,
    dedup_items,
    iso,
    new_tenant,
    usage_body,
    zone_away_from_midnight,
)


@pytest.fixture
def tenant(api):
    return new_tenant()


def post(api, tenant, body, token=None):
    return api.post(tenant.app_path + "/usage", body, token=token or tenant.token)


def nothing_written():
    return all_items(tables.USAGE_AGG_SHARDED) == []


# --- the single record -----------------------------------------------------------------


def test_accepted_record_answers_202_with_shard_cost_and_daily_total(api, tenant):
    body = usage_body()
    reply = post(api, tenant, body)
    assert reply.status == 202, reply
    answer = reply.json()
    assert answer["request_id"] == body["request_id"]
    assert answer["status"] == "accepted" and answer["message"] == "Usage data queued for processing"
    assert answer["duplicate"] is False
    assert answer["processing"] == {
        "shard_id": keys.marker_bucket("app-1", body["request_id"], 8),
        "expected_aggregation_lag_secs": 2,
        "cost_usd_micros": 3760,
    }
    assert answer["pricing"]["source"] == "CONFIG_FALLBACK"
    assert answer["timestamp"].endswith("Z")
    day = org_day("America/New_York")
    assert answer["daily_total"] == {
        "label": "premium",
        "org_day": day,
        "cost_usd_micros": 0,
        "requests": 0,
        "quota_usd_micros": 10_000_000,
        "quota_pct": 0.0,
        "status": "NORMAL",
        "mode": "NORMAL",
        "aggregated_at": None,
    }


def test_a_record_is_its_dedup_marker_and_the_fold_counts_it_in_its_label_total(api, tenant, fold_stream):
    body = usage_body(cache_read_input_tokens=2000, cache_write_input_tokens=1000)
    post(api, tenant, body)
    day = org_day("America/New_York")
    [dedup] = dedup_items()
    assert {"shard_key": dedup["shard_key"], "date_key": dedup["date_key"]} == keys.marker_key(
        tenant.org_id, "app-1", body["request_id"], 8
    )
    assert (dedup["shard_id"], dedup["cost_usd_micros"], dedup["model_label"], dedup["org_day"]) == (
        keys.marker_bucket("app-1", body["request_id"], 8),
        3760 + 400 + 800,  # cache read 0.20, cache write 0.80 USD per 1M
        "premium",
        day,
    )
    assert (dedup["input_tokens"], dedup["output_tokens"]) == (1500, 800)
    assert (dedup["cache_read_input_tokens"], dedup["cache_write_input_tokens"]) == (2000, 1000)
    assert dedup["scopes"] == [tenant.scope]
    assert 3 * 86400 - 60 < int(dedup["expires_at_epoch"]) - datetime.now(UTC).timestamp() <= 3 * 86400
    assert "active_day" not in dedup  # not in the aggregator's index
    # beside it only the new label-day's index entry: no counters, under the org's bucket
    [entry] = [item for item in all_items(tables.USAGE_AGG_SHARDED) if not item["date_key"].startswith("APP#")]
    assert {"shard_key": entry["shard_key"], "date_key": entry["date_key"]} == keys.day_entry_key(
        tenant.scope, "premium", day
    )
    assert entry["active_day"] == keys.active_day_key(day, tenant.org_id)  # f"DAY#{day}#{the org's bucket}"
    assert not set(entry) & set(usage.COUNTERS)
    assert daily_total(tenant.scope, "premium", day) is None  # totals move only when the stream is folded
    fold_stream()
    total = daily_total(tenant.scope, "premium", day)
    assert (total["input_tokens"], total["output_tokens"], total["requests"]) == (1500, 800, 1)
    assert (total["cache_read_input_tokens"], total["cache_write_input_tokens"]) == (2000, 1000)
    assert total["cost_usd_micros"] == 4960
    assert int(total["expires_at_epoch"]) > datetime.now(UTC).timestamp() + 399 * 86400


def test_a_retry_is_counted_once_and_answers_with_the_original(api, tenant, fold_stream):
    body = usage_body()
    first = post(api, tenant, body).json()
    changed = {"input_tokens": 999_999, "model_label": "standard", "bedrock_model_id": "amazon.nova-2-lite-v1:0"}
    retry = post(api, tenant, {**body, **changed})
    assert retry.status == 202
    again = retry.json()
    assert again["duplicate"] is True and "already accepted" in again["message"]
    assert again["processing"] == first["processing"]
    assert again["daily_total"]["label"] == "premium"
    fold_stream()
    day = org_day("America/New_York")
    total = daily_total(tenant.scope, "premium", day)
    assert (total["requests"], total["cost_usd_micros"]) == (1, 3760)
    assert daily_total(tenant.scope, "standard", day) is None
    assert len(dedup_items()) == 1


def test_request_ids_are_case_insensitive_uuids(api, tenant):
    body = usage_body()
    post(api, tenant, body)
    assert post(api, tenant, {**body, "request_id": body["request_id"].upper()}).json()["duplicate"] is True


def test_org_scope_counts_every_app_in_one_scope_and_a_capped_app_in_its_own_counters(api, fold_stream):
    tenant = new_tenant(quota_scope="ORG", app_overrides={"app_daily_cap_usd_micros": 10**9})
    post(api, tenant, usage_body())
    app_counter = orgs.effective_config(tenant.org_id, tenant.app_id).app_counter
    assert app_counter == f"ORG#{tenant.org_id}#APP#{tenant.app_id}"
    [marker] = dedup_items()
    assert marker["scopes"] == [f"ORG#{tenant.org_id}", app_counter]
    fold_stream()
    day = org_day("America/New_York")
    org_total = daily_total(f"ORG#{tenant.org_id}", "premium", day)
    assert (org_total["cost_usd_micros"], org_total["requests"]) == (3760, 1)
    own = daily_total(app_counter, "premium", day)  # its share, against its daily cap
    assert {name: own[name] for name in ("cost_usd_micros", "requests")} == {
        name: org_total[name] for name in ("cost_usd_micros", "requests")
    }


def test_an_app_without_a_cap_writes_no_counters_of_its_own(api, fold_stream):
    tenant = new_tenant(quota_scope="ORG")
    post(api, tenant, usage_body())
    assert [marker["scopes"] for marker in dedup_items()] == [[f"ORG#{tenant.org_id}"]]
    fold_stream()
    day = org_day("America/New_York")
    assert daily_total(f"ORG#{tenant.org_id}", "premium", day)["requests"] == 1
    assert daily_total(f"ORG#{tenant.org_id}#APP#{tenant.app_id}", "premium", day) is None


def test_an_org_token_may_report_for_its_apps(api, tenant):
    assert post(api, tenant, usage_body(), token=tenant.org_token).status == 202


def test_a_record_stamped_yesterday_counts_toward_the_day_it_arrives(api, fold_stream):
    zone = zone_away_from_midnight()
    tenant = new_tenant(timezone=zone)
    yesterday = org_date(zone) - timedelta(days=1)
    yesterday_noon = day_start_utc(zone, yesterday) + timedelta(hours=12)
    reply = post(api, tenant, usage_body(timestamp=iso(yesterday_noon)))
    assert reply.status == 202 and reply.json()["daily_total"]["org_day"] == org_day(zone)
    assert dedup_items()[0]["org_day"] == org_day(zone)
    fold_stream()
    assert daily_total(tenant.scope, "premium", org_day(zone))["requests"] == 1  # today's quota, not yesterday's
    assert daily_total(tenant.scope, "premium", yesterday.strftime("%Y%m%d")) is None


def test_a_config_label_outside_the_ordering_is_counted(api, tenant, fold_stream):
    reply = post(api, tenant, usage_body(model_label="ultra_premium"))  # in config.yaml, not in the ordering
    assert reply.status == 202, reply
    fold_stream()
    total = daily_total(tenant.scope, "ultra_premium", org_day("America/New_York"))
    assert (total["requests"], total["cost_usd_micros"]) == (1, reply.json()["processing"]["cost_usd_micros"])


def test_token_counts_over_the_labels_cap_are_400_with_the_limit(api, tenant):
    body = assert_error(post(api, tenant, usage_body(output_tokens=128_001)), 400, "INVALID_REQUEST")
    assert body["details"] == {"field": "output_tokens", "limit": 128_000, "value": 128_001, "model_label": "premium"}
    assert post(api, tenant, usage_body(input_tokens=1_000_000, output_tokens=128_000)).status == 202


# --- errors (spec error schema; nothing written) -------------------------------------------


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"request_id": "not-a-uuid"}, "INVALID_REQUEST"),
        ({"request_id": "7c9e6679742540de944be07fc1f90ae7"}, "INVALID_REQUEST"),  # UUID, not canonical
        ({"model_label": "ultra_mega"}, "INVALID_MODEL_LABEL"),
        ({"model_label": "has#hash"}, "INVALID_MODEL_LABEL"),
        ({"timestamp": "0001-01-01T00:00:00+14:00"}, "INVALID_REQUEST"),  # before year 1 in UTC
        ({"timestamp": "9999-12-31T23:59:59-14:00"}, "INVALID_REQUEST"),  # after year 9999 in UTC
        ({"input_tokens": 1_000_001}, "INVALID_REQUEST"),  # over the per-record caps
        ({"output_tokens": 128_001}, "INVALID_REQUEST"),
        ({"cache_write_input_tokens": 1_000_001}, "INVALID_REQUEST"),
        ({"input_tokens": -1}, "INVALID_REQUEST"),
        ({"output_tokens": "800"}, "INVALID_REQUEST"),
        ({"output_tokens": 8.5}, "INVALID_REQUEST"),
        ({"input_tokens": True}, "INVALID_REQUEST"),
        ({"cache_read_input_tokens": -5}, "INVALID_REQUEST"),
        ({"input_tokens": 10**11}, "INVALID_REQUEST"),
        ({"status": "FAILED"}, "INVALID_REQUEST"),
        ({"calling_region": "US-EAST-1"}, "INVALID_REQUEST"),
        ({"timestamp": "yesterday"}, "INVALID_REQUEST"),
        ({"timestamp": iso(datetime.now(UTC) + timedelta(hours=1))}, "INVALID_REQUEST"),
        ({"timestamp": iso(datetime.now(UTC) - timedelta(days=3))}, "INVALID_REQUEST"),
        ({"cost_usd_micros": 1}, "INVALID_REQUEST"),  # clients never send cost
    ],
)
def test_invalid_records_are_400_and_write_nothing(api, tenant, changes, code):
    assert_error(post(api, tenant, usage_body(**changes)), 400, code)
    assert nothing_written()


@pytest.mark.parametrize(
    "missing", ["request_id", "model_label", "bedrock_model_id", "input_tokens", "output_tokens", "status", "timestamp"]
)
def test_required_fields(api, tenant, missing):
    body = usage_body()
    del body[missing]
    assert_error(post(api, tenant, body), 400, "INVALID_REQUEST")


def test_label_errors_carry_the_spec_details(api, tenant):
    body = assert_error(post(api, tenant, usage_body(model_label="nope")), 400, "INVALID_MODEL_LABEL")
    assert "premium" in body["details"]["valid_labels"]


def test_timestamp_range_error_carries_the_window(api, tenant):
    body = assert_error(
        post(api, tenant, usage_body(timestamp=iso(datetime.now(UTC) - timedelta(days=3)))), 400, "INVALID_REQUEST"
    )
    assert body["message"] == "Timestamp outside acceptable range"
    assert set(body["details"]) == {"timestamp", "org_day", "timezone", "acceptable_range"}
    assert body["details"]["timezone"] == "America/New_York"


def test_authorization(api, tenant):
    assert_error(api.post(tenant.app_path + "/usage", usage_body()), 401, "UNAUTHORIZED")
    assert_error(post(api, tenant, usage_body(), token="not-a-jwt"), 401, "UNAUTHORIZED")
    assert_error(post(api, tenant, usage_body(), token=new_tenant().token), 403, "FORBIDDEN")
    assert_error(post(api, tenant, usage_body(), token=token_for(tenant.org_id, "other-app")), 403, "FORBIDDEN")
    assert nothing_written()


def test_unknown_org_or_app_is_404(api, tenant):
    ghost = token_for(tenant.org_id, "ghost")
    reply = api.post(f"/api/v1/orgs/{tenant.org_id}/apps/ghost/usage", usage_body(), token=ghost)
    assert_error(reply, 404, "NOT_FOUND")
    org_id = str(uuid.uuid4())
    assert_error(
        api.post(f"/api/v1/orgs/{org_id}/apps/app-1/usage", usage_body(), token=token_for(org_id, "app-1")),
        404,
        "NOT_FOUND",
    )
    assert nothing_written()


# --- batch ----------------------------------------------------------------------------------


def post_batch(api, tenant, records):
    return api.post(tenant.app_path + "/usage/batch", {"requests": records}, token=tenant.token)


def folded_requests(fold_stream, tenant, labels=("premium", "standard", "economy")) -> dict[str, int]:
    """The requests of each label of the tenant's scope today once the usage stream is folded."""
    fold_stream()
    day = org_day("America/New_York")
    found = {label: daily_total(tenant.scope, label, day) for label in labels}
    return {label: int(total["requests"]) for label, total in found.items() if total}


def test_batch_answers_207_with_a_result_per_record(api, tenant, fold_stream):
    good, standard = usage_body(), usage_body(model_label="standard")
    records = [
        good,
        usage_body(model_label="ultra_mega"),
        {"request_id": "x"},
        42,
        standard,
        good,
        usage_body(timestamp="9999-12-31T23:59:59-14:00"),
    ]
    reply = post_batch(api, tenant, records)
    assert reply.status == 207, reply
    body = reply.json()
    assert (body["accepted"], body["failed"]) == (3, 4)
    results = body["results"]
    assert [r["status"] for r in results] == [
        "accepted",
        "failed",
        "failed",
        "failed",
        "accepted",
        "accepted",
        "failed",
    ]
    assert results[0] == {
        "request_id": good["request_id"],
        "status": "accepted",
        "shard_id": keys.marker_bucket("app-1", good["request_id"], 8),
        "cost_usd_micros": 3760,
        "duplicate": False,
    }
    assert results[1]["error"] == "INVALID_MODEL_LABEL" and results[1]["request_id"] == records[1]["request_id"]
    assert results[2]["error"] == "INVALID_REQUEST" and results[3] == {
        "request_id": None,
        "status": "failed",
        "error": "INVALID_REQUEST",
        "message": "Request validation failed",
    }
    assert results[5]["duplicate"] is True and results[5]["shard_id"] == results[0]["shard_id"]
    assert results[6]["error"] == "INVALID_REQUEST"  # an edge-of-calendar timestamp fails only its record
    assert body["timestamp"].endswith("Z")
    assert len(dedup_items()) == 2
    assert folded_requests(fold_stream, tenant) == {"premium": 1, "standard": 1}
    # The quota position of each label the batch counted, as a single report answers it.
    day = org_day("America/New_York")
    assert [(t["label"], t["org_day"], t["status"], t["mode"]) for t in body["daily_totals"]] == [
        ("premium", day, "NORMAL", "NORMAL"),
        ("standard", day, "NORMAL", "NORMAL"),
    ]


def test_a_batch_retried_whole_is_counted_once(api, tenant, fold_stream):
    records = [usage_body() for _ in range(20)]
    post_batch(api, tenant, records)
    again = post_batch(api, tenant, records).json()
    assert again["accepted"] == 20 and all(result["duplicate"] for result in again["results"])
    assert folded_requests(fold_stream, tenant) == {"premium": 20}
    assert daily_total(tenant.scope, "premium", org_day("America/New_York"))["cost_usd_micros"] == 20 * 3760


def test_a_request_id_repeated_in_a_batch_is_answered_from_its_first_without_a_write(api, tenant, fold_stream):
    """Red-team note: each repeat was written on its own, so one id a hundred times was a
    hundred transactions for one rate-limited request."""
    transactions = []
    ddb_client().meta.events.register("before-call.dynamodb.TransactWriteItems", lambda **_: transactions.append(1))
    body = usage_body()
    results = post_batch(api, tenant, [body] * 100).json()["results"]
    assert len(transactions) == 1
    assert [result["duplicate"] for result in results] == [False] + [True] * 99
    assert {result["cost_usd_micros"] for result in results} == {3_760}
    assert folded_requests(fold_stream, tenant) == {"premium": 1}


@pytest.mark.parametrize("records", [[], [usage_body() for _ in range(101)]])
def test_batch_size_is_1_to_100(api, tenant, records):
    assert_error(post_batch(api, tenant, records), 400, "INVALID_REQUEST")
    assert nothing_written()


def test_batch_body_must_be_an_object_with_requests(api, tenant):
    assert_error(api.post(tenant.app_path + "/usage/batch", [usage_body()], token=tenant.token), 400, "INVALID_REQUEST")
    assert_error(
        api.post(tenant.app_path + "/usage/batch", {"records": []}, token=tenant.token), 400, "INVALID_REQUEST"
    )
    assert_error(api.post(tenant.app_path + "/usage/batch", {"requests": [usage_body()]}), 401, "UNAUTHORIZED")


def test_a_full_batch_of_100_is_accepted(api, tenant, fold_stream):
    body = post_batch(api, tenant, [usage_body() for _ in range(100)]).json()
    assert body["accepted"] == 100
    fold_stream()
    total = daily_total(tenant.scope, "premium", org_day("America/New_York"))
    assert (total["requests"], total["cost_usd_micros"]) == (100, 376_000)


def test_a_batch_of_new_label_days_shares_transactions_a_marker_per_record_and_one_entry_per_label_day(
    api, tenant, fold_stream
):
    """100 records over three label-days not folded yet: two transactions (103 actions do
    not fit in one), holding the 100 markers and one index entry per label-day each (a
    record's write units are its marker's alone); the fold counts every record once."""
    transactions = []
    ddb_client().meta.events.register_first(
        "before-parameter-build.dynamodb.TransactWriteItems",
        lambda params, **_: transactions.append(copy.deepcopy(params["TransactItems"])),
    )
    labels = ["premium", "standard", "premium", "economy"] * 25
    body = post_batch(api, tenant, [usage_body(model_label=label) for label in labels]).json()
    assert body["accepted"] == 100 and not any(result["duplicate"] for result in body["results"])
    assert len(transactions) == 2 and all(len(actions) <= 100 for actions in transactions)
    markers = [action for actions in transactions for action in actions if "Put" in action]
    entries = [[a["Update"]["Key"]["shard_key"] for a in actions if "Update" in a] for actions in transactions]
    assert len(markers) == 100 and all(len(listed) == len(set(listed)) <= 3 for listed in entries)
    for actions, listed in zip(transactions, entries, strict=True):  # an entry for each label-day of its records
        assert {action["Put"]["Item"]["model_label"] for action in actions if "Put" in action} == {
            keys.split_usage_key(usage_key)[1] for usage_key in listed
        }
    shard_of = {result["request_id"]: result["shard_id"] for result in body["results"]}
    assert all(
        shard_of[action["Put"]["Item"]["date_key"].rsplit("#", 1)[-1]] == int(action["Put"]["Item"]["shard_id"])
        for action in markers
    )
    fold_stream()
    day = org_day("America/New_York")
    for label in ("premium", "standard", "economy"):
        costs = [result["cost_usd_micros"] for result, of in zip(body["results"], labels, strict=True) if of == label]
        total = daily_total(tenant.scope, label, day)
        assert (total["requests"], total["cost_usd_micros"]) == (len(costs), sum(costs)), label


def test_a_batch_part_counted_before_writes_the_rest_once(api, tenant, fold_stream):
    """The shared transaction cancels on the markers of the records counted before: those
    are answered as duplicates, the others written again (once)."""
    records = [usage_body() for _ in range(20)]
    post_batch(api, tenant, records[5:12])
    body = post_batch(api, tenant, records).json()
    assert body["accepted"] == 20
    assert [result["duplicate"] for result in body["results"]] == [n in range(5, 12) for n in range(20)]
    assert len(dedup_items()) == 20
    assert folded_requests(fold_stream, tenant) == {"premium": 20}


def prepared(count: int = 1) -> tuple[list[metering.Submission], datetime]:
    """``count`` records of a new tenant, validated and priced (not written), and the time."""
    tenant = new_tenant()
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    now = datetime.now(UTC)
    return [metering.prepare(config, UsageRequest.model_validate(usage_body()), now) for _ in range(count)], now


def conflict_then(stubber: Stubber, reasons: list[dict], *responses: str) -> None:
    """Stub a transaction cancelled for ``reasons``, then the ``responses`` (operation names) that follow."""
    stubber.add_client_error(
        "transact_write_items",
        "TransactionCanceledException",
        "cancelled",
        400,
        modeled_fields={"CancellationReasons": reasons},
    )
    for operation in responses:
        stubber.add_response(operation, {})


def written_transactions() -> tuple[list[str], list[list[dict]]]:
    """The ClientRequestToken and the actions (before boto3 serialises them) of each
    TransactWriteItems the service's client sends from now on."""
    tokens, items = [], []

    def seen(params, **_):
        tokens.append(params["ClientRequestToken"])
        items.append(copy.deepcopy(params["TransactItems"]))

    ddb_client().meta.events.register_first("before-parameter-build.dynamodb.TransactWriteItems", seen)
    return tokens, items


def test_a_batch_whose_transaction_meets_a_conflict_writes_it_again_with_a_new_token(aws):
    """Three records of a label-day not folded yet share a transaction (their markers and
    the label-day's index entry); cancelled by a concurrent write on the entry, the same
    actions are written again, with a new token, and every record is counted."""
    submissions, now = prepared(3)
    submissions = [submission._replace(lists_day=True) for submission in submissions]
    tokens, items = written_transactions()
    with Stubber(ddb_client()) as stubber:
        conflict_then(stubber, [{"Code": "None"}] * 3 + [{"Code": "TransactionConflict"}], "transact_write_items")
        outcomes = metering.record_group(submissions, now)
        stubber.assert_no_pending_responses()
    assert [outcome.duplicate for outcome in outcomes] == [False] * 3
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    assert len(items[0]) == 4 and items[0] == items[1]
    assert [outcome.shard_id for outcome in outcomes] == [submission.shard_id for submission in submissions]


# --- the write under conflicts, races and volume ----------------------------------------------


@pytest.mark.parametrize(
    "reasons",
    [
        [{"Code": "None"}, {"Code": "TransactionConflict"}],  # a concurrent write on the label-day's index entry
        [{"Code": "None"}, {"Code": "ThrottlingError"}],
        # a copy of the same record in flight on another container holds its marker
        [{"Code": "TransactionConflict"}, {"Code": "None"}],
    ],
    ids=["conflict", "throttled", "own-marker"],
)
def test_a_transaction_conflict_is_retried_with_a_new_token(aws, reasons):
    """A record of a label-day not folded yet is its marker and the label-day's index entry
    in one transaction; cancelled for anything but its marker's condition, the very same
    actions are written again with a new token."""
    (submission,), now = prepared()
    submission = submission._replace(lists_day=True)
    tokens, items = written_transactions()
    with Stubber(ddb_client()) as stubber:
        conflict_then(stubber, reasons, "transact_write_items")
        outcome = metering.record(submission, now)
        stubber.assert_no_pending_responses()
    assert outcome.duplicate is False and outcome.cost_usd_micros == 3760
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    # an SDK retry of one attempt resends the very same token: DynamoDB applies it once; the
    # retry after the conflict writes the same actions, behind the same dedup item
    assert usage.request_token(items[0], 0) == tokens[0]
    assert usage.request_token(items[1], 1) == tokens[1]
    assert items[0] == items[1] and [next(iter(action)) for action in items[0]] == ["Put", "Update"]
    assert outcome.shard_id == submission.shard_id == keys.marker_bucket("app-1", submission.request_id, 8)


@pytest.mark.slow  # 400 submissions from 8 threads on moto; make test runs it
def test_concurrent_submissions_with_duplicates_total_exactly_the_unique_ids(aws, fold_stream):
    tenant = new_tenant()
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    rng = random.Random(7)
    unique = [
        usage_body(
            input_tokens=rng.randrange(0, 50_000),
            output_tokens=rng.randrange(0, 20_000),
            cache_read_input_tokens=rng.randrange(0, 5_000),
        )
        for _ in range(280)
    ]
    submissions = unique + [dict(rng.choice(unique)) for _ in range(120)]  # 30 % retries and races
    rng.shuffle(submissions)
    answers, errors = [], []
    chunks = [submissions[i::8] for i in range(8)]

    def worker(chunk):
        try:
            for body in chunk:
                answers.append(metering.submit(tenant.org_id, tenant.app_id, UsageRequest.model_validate(body)))
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(chunk,)) for chunk in chunks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fold_stream()
    assert errors == []
    assert len(answers) == 400 and sum(1 for a in answers if a["duplicate"]) == 120
    expected_cost = sum(
        metering.prepare(config, UsageRequest.model_validate(body), datetime.now(UTC)).cost_usd_micros
        for body in unique
    )
    total = daily_total(tenant.scope, "premium", org_day("America/New_York"))
    assert total["requests"] == 280
    assert total["cost_usd_micros"] == expected_cost
    assert total["input_tokens"] == sum(body["input_tokens"] for body in unique)
    assert total["cache_read_input_tokens"] == sum(body["cache_read_input_tokens"] for body in unique)


@pytest.mark.slow
def test_5000_submissions_for_one_label_and_day_keep_every_item_under_1_kb(aws, fold_stream):
    tenant = new_tenant()
    config = orgs.effective_config(tenant.org_id, tenant.app_id)
    now = datetime.now(UTC)
    requests = [UsageRequest.model_validate(usage_body(output_tokens=1000 + i)) for i in range(5000)]
    for request in requests:
        metering.record(metering.prepare(config, request, now), now)
    fold_stream()
    items = all_items(tables.USAGE_AGG_SHARDED) + all_items(tables.DAILY_TOTAL)
    # the markers, the label-day's index entry, its label total (a config label: kept apart from
    # the scope total, which has nothing), the config labels, the heartbeat, the stream shard's progress
    assert len(dedup_items()) == 5000 and len(items) == 5000 + 5
    sizes = [item_size(item) for item in items]
    assert max(sizes) < 1024
    total = daily_total(tenant.scope, "premium", org_day(config.timezone, now))
    assert item_size(total) < 400  # a label total is a handful of counters, whatever the volume
    assert total["requests"] == 5000


def in_a_new_process(program: str) -> str:
    """What ``program`` prints in a new Python process with the layer on its path (another
    container: its own process-keyed hashes)."""
    import subprocess
    import sys

    layer = str(Path(keys.__file__).parents[2])  # (price_keeper/store/keys.py)
    env = {"PYTHONPATH": layer}
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, env=env).stdout


def test_the_same_write_from_two_containers_never_shares_a_request_token():
    """A retry on another container, in the same second, builds the very same actions; with
    the same ClientRequestToken DynamoDB would answer it as an idempotent repeat of the
    first (a success: a duplicate answered as counted). SDK retries within one container
    keep their token."""
    items = [{"Put": {"TableName": "t", "Item": keys.marker_key("o", "a", "r", 8)}}]
    program = f"from price_keeper.store import usage; print(usage.request_token({items!r}, 0))"
    assert len({in_a_new_process(program) for _ in range(2)}) == 2
    assert usage.request_token(items, 0) == usage.request_token(items, 0) != usage.request_token(items, 1)


def test_a_records_marker_bucket_is_the_same_in_every_process_and_spreads_an_orgs_records():
    """A retry served by another container must find the first acceptance's marker: its
    bucket (``processing.shard_id``) is a hash of the app and request id, the same in every
    process, and an org's records spread over its ``agg_shard_count`` buckets."""
    ids = [f"0b6a1c52-9f1e-4f5b-8d2a-{n:012d}" for n in range(64)]
    program = f"from price_keeper.store import keys; print([keys.marker_bucket('app-1', i, 8) for i in {ids!r}])"
    here = [keys.marker_bucket("app-1", i, 8) for i in ids]
    assert in_a_new_process(program).strip() == str(here)
    assert set(here) == set(range(8))
    assert {keys.marker_key("o", "app-1", i, 8)["shard_key"] for i in ids} == {
        keys.markers_partition("o", bucket) for bucket in range(8)
    }


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_grace_bookings_take_no_more_than_the_closed_day_had_left_and_the_rest_counts_today(aws, fold_stream, batched):
    """Outside review M5: 30 records stamped 23:59:50 and sent at 00:00:20 put 10.9x the
    closed day's quota on that day, and today's quota saw none of it. On a simulated clock
    (the service's ``now``): the closed day had 6,000 of its 10,000 left, so one 3,760
    record fits there and the other 29 count today, whether sent one by one or as a batch;
    the folded totals agree."""
    tenant = new_tenant(timezone="UTC", quotas={"premium": 10_000, "standard": 10**9, "economy": 10**9})
    midnight = day_start_utc("UTC", org_date("UTC"))
    closed, today = org_day("UTC", midnight - timedelta(seconds=1)), org_day("UTC", midnight)
    spent_before = metering.submit(  # the closed day's spend before midnight: 4,000 of 10,000
        tenant.org_id,
        tenant.app_id,
        UsageRequest.model_validate(
            usage_body(input_tokens=5000, output_tokens=0, timestamp=iso(midnight - timedelta(minutes=30)))
        ),
        midnight - timedelta(minutes=30),
    )
    assert (spent_before["daily_total"]["org_day"], spent_before["processing"]["cost_usd_micros"]) == (closed, 4000)
    fold_stream()
    now, stamped = midnight + timedelta(seconds=20), iso(midnight - timedelta(seconds=10))
    bodies = [usage_body(timestamp=stamped) for _ in range(30)]
    if batched:
        results = metering.submit_batch(tenant.org_id, tenant.app_id, bodies, now)["results"]
        costs = [result["cost_usd_micros"] for result in results]
    else:
        replies = [
            metering.submit(tenant.org_id, tenant.app_id, UsageRequest.model_validate(body), now) for body in bodies
        ]
        assert [reply["daily_total"]["org_day"] for reply in replies] == [closed] + [today] * 29
        costs = [reply["processing"]["cost_usd_micros"] for reply in replies]
    assert costs == [3760] * 30
    fold_stream()
    totals = daily_totals.read_days([(keys.usage_key(tenant.scope, "premium"), day) for day in (closed, today)])
    spend = {day: int(item["cost_usd_micros"]) for (_, day), item in totals.items()}
    assert spend == {closed: 4000 + 3760, today: 29 * 3760}
    assert spend[closed] <= 10_000
