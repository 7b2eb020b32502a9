"""The seven tables as ``price_keeper.store.tables`` defines them."""

from __future__ import annotations

import pytest

from price_keeper.store.tables import ALL_TABLES, USAGE_AGG_SHARDED

pytestmark = pytest.mark.infra


def _table(synth, spec) -> dict:
    return synth.json["Resources"][synth.table_ids()[spec]]


def test_exactly_the_seven_tables(synth):
    names = {t["Properties"]["TableName"] for t in synth.resources("AWS::DynamoDB::Table").values()}
    assert names == {f"price-keeper-dev-{spec.name}" for spec in ALL_TABLES}
    assert len(ALL_TABLES) == 7


@pytest.mark.parametrize("spec", ALL_TABLES, ids=lambda s: s.name)
def test_keys_billing_and_ttl(synth, spec):
    props = _table(synth, spec)["Properties"]
    assert props["KeySchema"] == spec.key_schema()
    assert sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
        ({"AttributeName": name, "AttributeType": "S"} for name in spec.attribute_names()),
        key=lambda a: a["AttributeName"],
    )
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    if spec.ttl_attribute:
        assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at_epoch", "Enabled": True}
    else:
        assert "TimeToLiveSpecification" not in props


def test_active_by_day_index_is_keys_only(synth):
    indexes = _table(synth, USAGE_AGG_SHARDED)["Properties"]["GlobalSecondaryIndexes"]
    assert indexes == [
        {
            "IndexName": "active-by-day",
            "KeySchema": [
                {"AttributeName": "active_day", "KeyType": "HASH"},
                {"AttributeName": "shard_key", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ]
    others = [spec for spec in ALL_TABLES if spec is not USAGE_AGG_SHARDED]
    assert all("GlobalSecondaryIndexes" not in _table(synth, spec)["Properties"] for spec in others)


@pytest.mark.parametrize("spec", ALL_TABLES, ids=lambda s: s.name)
def test_money_tables_are_protected_and_retained_and_every_table_is_recoverable(synth, spec):
    table = _table(synth, spec)
    props = table["Properties"]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    if spec.holds_money:
        assert props["DeletionProtectionEnabled"] is True
        # retained but for a failed create, which deletes them (tests/infra/test_new_account.py)
        assert (table["DeletionPolicy"], table["UpdateReplacePolicy"]) == ("RetainExceptOnCreate", "Retain")
    else:
        assert not props.get("DeletionProtectionEnabled", False)
        assert table["DeletionPolicy"] == "Delete"


def test_money_tables_are_config_usage_and_totals():
    assert {spec.name for spec in ALL_TABLES if spec.holds_money} == {"config", "usage-agg-sharded", "daily-total"}


def test_table_prefix_from_context(synth_options):
    names = {t["Properties"]["TableName"] for t in synth_options.resources("AWS::DynamoDB::Table").values()}
    assert names == {f"pk-{spec.name}" for spec in ALL_TABLES}
