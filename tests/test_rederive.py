"""Totals re-derived from their records (``domain.rederive``): a stream batch lost to the
stream's retention is recovered by the audit, reading the org's markers by key."""

from datetime import timedelta

from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

from local.streams import StreamReader, lambda_event
from price_keeper import bodies
from price_keeper.bodies import UsageRequest
from price_keeper.domain import ledger, metering, rederive, repair, voids
from price_keeper.store import keys, tables
from price_keeper.store import reconciliation as reconciliation_store
from price_keeper.store.dynamo import table
from price_keeper.timeutil import day_start_utc, org_date, org_day, utc_now
from tests.iam_check import only_granted
from tests.usage_support import daily_total, fold_usage, new_tenant, usage_body

ZONE = "America/New_York"


def report(tenant, **fields) -> dict:
    return metering.submit(tenant.org_id, tenant.app_id, UsageRequest(**usage_body(**fields)))


def settled_audit_time(day_of: str):
    """When the audit re-derives org day ``day_of`` of ``ZONE``: its end + grace + 26 h."""
    end = day_start_utc(ZONE, org_date(ZONE) + timedelta(days=1))
    assert org_day(ZONE) == day_of
    return end + timedelta(seconds=900 + rederive.SETTLED_SECS + 60)


def fold(reader: StreamReader) -> None:
    """What the stream gained since ``reader`` last read, folded (the aggregator's fold)."""
    for shard_id, records in reader.read().items():
        ledger.fold_batch(DynamoDBStreamEvent(lambda_event(records, shard_id)).records, shard_id)


def test_a_batch_the_stream_lost_is_recovered_by_the_audit_from_the_markers_by_key(aws, dynamodb_calls):
    """Two records folded, then two whose stream records are dropped (trimmed unfolded); a
    void folded. The audit that runs once the day is settled reads the org's markers with a
    Query of each bucket (no Scan), writes the label total to what its records sum to, hour
    marks and all, and the next audit writes nothing."""
    tenant = new_tenant(timezone=ZONE)
    reader = StreamReader(tables.USAGE_AGG_SHARDED)
    folded = [report(tenant), report(tenant, model_label="standard")]
    fold(reader)
    lost = [report(tenant), report(tenant)]
    reader.read()  # read and dropped: as the stream trims them unfolded
    voided = folded[0]["request_id"]
    request = bodies.VoidRequest(app_id=tenant.app_id, request_ids=[voided], reason="test")
    assert voids.void(tenant.org_id, request)["voided"] == 1
    fold(reader)  # the void is folded, and the shard's progress moves past the lost records
    day = org_day(ZONE)
    premium = daily_total(tenant.scope, "premium", day)
    assert (int(premium["requests"]), int(premium["voids"])) == (0, 1)  # the two lost are nowhere

    dynamodb_calls.clear()
    with only_granted("aggregator"):
        ran = repair.run(settled_audit_time(day))
    assert ran.totals_written == 1 and [label for _, label in [keys.split_usage_key(k) for k, _ in ran.changed]] == [
        "premium"
    ]
    queried = [params for op, params in dynamodb_calls if op == "Query" and "IndexName" not in params]
    assert len(queried) == 8 and not [op for op, _ in dynamodb_calls if op == "Scan"]  # the org's 8 buckets
    premium = daily_total(tenant.scope, "premium", day)
    cost = sum(receipt["processing"]["cost_usd_micros"] for receipt in lost)
    assert (int(premium["cost_usd_micros"]), int(premium["requests"]), int(premium["voids"])) == (cost, 2, 1)
    marks = reconciliation_store.marks_of(premium)
    assert marks and marks[-1][1][0] == 2  # its requests as of the last hour a record of it changed
    standard = daily_total(tenant.scope, "standard", day)
    assert (int(standard["requests"]), int(standard["cost_usd_micros"])) == (
        1,
        folded[1]["processing"]["cost_usd_micros"],
    )
    # config labels are kept apart from the scope total: re-deriving them adds nothing to it
    scope_total = (
        table(tables.DAILY_TOTAL)
        .get_item(Key={"usage_key": keys.scope_total_key(tenant.scope), "date_key": keys.day_key(day)})
        .get("Item", {})
    )
    assert int(scope_total.get("cost_usd_micros", 0)) == 0

    dynamodb_calls.clear()
    assert repair.run(settled_audit_time(day) + timedelta(minutes=1)).totals_written == 0  # right now: read only
    assert not [op for op, _ in dynamodb_calls if op in ("TransactWriteItems", "UpdateItem")]


def test_a_day_whose_records_changed_lately_is_left_alone(aws, caplog):
    """A change the stream may still hold (a record or a void of the last 26 h) can still be
    folded: re-deriving before it is would count it twice. Such a day is left, and logged."""
    tenant = new_tenant(timezone=ZONE)
    report(tenant)
    StreamReader(tables.USAGE_AGG_SHARDED).read()  # dropped
    day = org_day(ZONE)
    early = rederive.rederive(tenant.org_id, day, utc_now() + timedelta(hours=25))
    assert early.totals_written == 0 and daily_total(tenant.scope, "premium", day) is None
    assert "re-derivation deferred" in caplog.text
    settled = rederive.rederive(tenant.org_id, day, utc_now() + timedelta(hours=27))
    assert settled.totals_written == 1 and int(daily_total(tenant.scope, "premium", day)["requests"]) == 1


def test_only_the_first_audit_past_a_settled_day_re_derives_it(aws):
    tenant = new_tenant(timezone=ZONE)
    report(tenant)
    fold_usage()
    day = org_day(ZONE)
    at = settled_audit_time(day)
    listed = [(keys.usage_key(tenant.scope, "premium"), keys.day_key(day))]
    assert rederive.due_org_days(listed, at) == [(tenant.org_id, day)]
    assert rederive.due_org_days(listed, at - timedelta(minutes=2)) == []  # not settled yet
    assert rederive.due_org_days(listed, at + timedelta(hours=1)) == []  # the audit before did it
