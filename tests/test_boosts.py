"""POST /api/v1/orgs/{org_id}/quota-boosts and ``boosts.active_boosts``/``apply``: creation,
every validation rule (with no write on refusal), scope prefixes, and expiry."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from boto3.dynamodb.conditions import Key

from price_keeper import bodies
from price_keeper.domain import boosts, orgs
from price_keeper.store import boosts as boost_store
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import ddb_client, table
from tests.conftest import PROVISIONING_KEY, assert_error
from tests.factories import seed_app, seed_org
from tests.provisioned import config_item, new_app, new_org


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _in(**delta) -> str:
    return _iso(datetime.now(UTC) + timedelta(**delta))


def post_boost(api, org_id, body, api_key=PROVISIONING_KEY):
    return api.post(f"/api/v1/orgs/{org_id}/quota-boosts", body, api_key=api_key)


def boost_items(org_id: str) -> list[dict]:
    return table(tables.CONFIG).query(
        KeyConditionExpression=Key("org_key").eq(keys.org_key(org_id)) & Key("resource_key").begins_with("BOOST#"),
        ConsistentRead=True,
    )["Items"]


@pytest.fixture
def org_scoped(aws):
    return seed_org(quota_scope="ORG")


@pytest.fixture
def app_scoped(aws):
    org_id = seed_org(quota_scope="APP")
    seed_app(org_id, "app-1")
    seed_app(org_id, "app-10")
    return org_id


# --- created -----------------------------------------------------------------------


def test_org_boost_is_created_stored_with_ttl_and_counted(api, org_scoped):
    expires_at = _in(hours=6)
    reply = post_boost(
        api, org_scoped, {"model_label": "premium", "amount_usd_micros": 5_000_000, "expires_at": expires_at}
    )
    assert reply.status == 201, reply
    body = reply.json()
    uuid.UUID(body["boost_id"])
    assert body == {
        "boost_id": body["boost_id"],
        "org_id": org_scoped,
        "app_id": None,
        "model_label": "premium",
        "amount_usd_micros": 5_000_000,
        "expires_at": expires_at,
        "created_at": body["created_at"],
    }
    [item] = boost_items(org_scoped)
    assert item["resource_key"] == f"BOOST#ORG#{body['boost_id']}"
    expiry = datetime.fromisoformat(expires_at)
    assert item[tables.TTL_ATTRIBUTE] == int(expiry.timestamp())
    now = datetime.now(UTC)
    assert boosts.active_boosts(orgs.effective_config(org_scoped), now) == {"premium": 5_000_000}
    # an ORG-scoped org has one quota: the app a caller asks for does not matter
    seed_app(org_scoped, "any-app")
    assert boosts.active_boosts(orgs.effective_config(org_scoped, "any-app"), now) == {"premium": 5_000_000}


def test_boosts_of_one_label_add_up_and_apply_raises_quotas(api, org_scoped):
    for amount in (1_000_000, 2_500_000):
        assert (
            post_boost(
                api, org_scoped, {"model_label": "standard", "amount_usd_micros": amount, "expires_at": _in(days=2)}
            ).status
            == 201
        )
    active = boosts.active_boosts(orgs.effective_config(org_scoped), datetime.now(UTC))
    assert active == {"standard": 3_500_000}
    quotas = {"premium": 10_000_000, "standard": 5_000_000}
    assert boosts.apply(quotas, active) == {"premium": 10_000_000, "standard": 8_500_000}
    assert quotas == {"premium": 10_000_000, "standard": 5_000_000}  # not modified in place
    assert boosts.apply({"premium": 1}, {"economy": 7}) == {"premium": 1, "economy": 7}


def test_app_boost_applies_to_that_app_only(api, app_scoped):
    reply = post_boost(
        api,
        app_scoped,
        {"model_label": "economy", "amount_usd_micros": 42, "expires_at": _in(days=7, minutes=-1), "app_id": "app-1"},
    )
    assert reply.status == 201, reply
    assert reply.json()["app_id"] == "app-1"
    [item] = boost_items(app_scoped)
    assert item["resource_key"] == f"BOOST#APP#app-1#{reply.json()['boost_id']}"
    now = datetime.now(UTC)
    assert boosts.active_boosts(orgs.effective_config(app_scoped, "app-1"), now) == {"economy": 42}
    assert boosts.active_boosts(orgs.effective_config(app_scoped, "app-10"), now) == {}  # the prefix ends with '#'
    assert boosts.active_boosts(orgs.effective_config(app_scoped), now) == {}  # no org-wide quota in APP scope


def test_label_of_the_apps_ordering_is_accepted(api, app_scoped):
    seed_app(
        app_scoped,
        "app-2",
        model_ordering=["tenant-a-premium", "economy"],
        quotas={"tenant-a-premium": 100, "economy": 100},
    )
    reply = post_boost(
        api,
        app_scoped,
        {"model_label": "tenant-a-premium", "amount_usd_micros": 1, "expires_at": _in(hours=1), "app_id": "app-2"},
    )
    assert reply.status == 201, reply


# --- validated (and nothing written) -----------------------------------------------------


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"expires_at": lambda: _in(minutes=-1)}, "expires_at"),  # times are computed when the test runs
        ({"expires_at": lambda: _in(days=7, minutes=5)}, "expires_at"),
        ({"expires_at": "2026-01-23T18:00:00"}, "expires_at"),  # no offset
        ({"expires_at": "next tuesday"}, "expires_at"),
        ({"amount_usd_micros": 0}, "amount_usd_micros"),
        ({"amount_usd_micros": -5}, "amount_usd_micros"),
        ({"amount_usd_micros": "5"}, "amount_usd_micros"),
        ({"amount_usd_micros": 2**63}, "amount_usd_micros"),
        ({"amount_usd_micros": True}, "amount_usd_micros"),
        ({"model_label": "bad#label"}, "model_label"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_bodies_are_400_and_write_nothing(api, org_scoped, changes, field):
    body = {
        "model_label": "premium",
        "amount_usd_micros": 1,
        "expires_at": _in(hours=1),
        **{name: value() if callable(value) else value for name, value in changes.items()},
    }
    error = assert_error(post_boost(api, org_scoped, body), 400, "INVALID_REQUEST")
    assert field in repr(error.get("details")) or field in error["message"]
    assert boost_items(org_scoped) == []


def test_missing_fields_are_400(api, org_scoped):
    assert_error(post_boost(api, org_scoped, {"model_label": "premium"}), 400, "INVALID_REQUEST")


def test_unknown_label_is_400_invalid_model_label(api, org_scoped):
    body = {"model_label": "gold", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    error = assert_error(post_boost(api, org_scoped, body), 400, "INVALID_MODEL_LABEL")
    assert "premium" in error["details"]["valid_labels"]
    assert boost_items(org_scoped) == []


def test_app_id_must_match_the_quota_scope(api, org_scoped, app_scoped):
    seed_app(org_scoped, "app-1")
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    error = assert_error(post_boost(api, org_scoped, {**body, "app_id": "app-1"}), 400, "INVALID_REQUEST")
    assert error["details"]["quota_scope"] == "ORG"
    error = assert_error(post_boost(api, app_scoped, body), 400, "INVALID_REQUEST")
    assert error["details"]["quota_scope"] == "APP"
    assert boost_items(org_scoped) == [] and boost_items(app_scoped) == []


def test_unknown_org_or_app_is_404(api, app_scoped):
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    assert_error(post_boost(api, str(uuid.uuid4()), body), 404, "NOT_FOUND")
    assert_error(post_boost(api, app_scoped, {**body, "app_id": "app-404"}), 404, "NOT_FOUND")
    assert boost_items(app_scoped) == []


def test_bad_org_id_is_400(api):
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    assert_error(post_boost(api, "not-a-uuid", body), 400, "INVALID_REQUEST")


@pytest.mark.parametrize("api_key", ["wrong-key", None])
def test_bad_or_missing_provisioning_key_is_401(api, org_scoped, api_key):
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    assert_error(post_boost(api, org_scoped, body, api_key=api_key), 401, "UNAUTHORIZED")
    assert boost_items(org_scoped) == []


# --- expiring ----------------------------------------------------------------------


def _store_boost(org_id: str, label: str, amount: int, expires: datetime) -> str:
    """An ORG boost as ``boosts.create`` writes it, its item and its entry on the org's item
    (to place expiries in the past); its id."""
    boost_id = str(uuid.uuid4())
    table(tables.CONFIG).put_item(
        Item={
            "org_key": keys.org_key(org_id),
            "resource_key": f"BOOST#ORG#{boost_id}",
            "boost_id": boost_id,
            "model_label": label,
            "amount_usd_micros": amount,
            "expires_at": _iso(expires),
            tables.TTL_ATTRIBUTE: int(expires.timestamp()),
        }
    )
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(org_id), "resource_key": keys.ROOT_RESOURCE},
        UpdateExpression="SET #boosts.#id = :entry",
        ExpressionAttributeNames={"#boosts": boost_store.BOOSTS_ATTRIBUTE, "#id": boost_id},
        ExpressionAttributeValues={":entry": [label, amount, int(expires.timestamp())]},
    )
    return boost_id


def test_expired_boost_no_longer_counts_while_its_item_and_entry_still_exist(org_scoped):
    now = datetime.now(UTC)
    _store_boost(org_scoped, "premium", 111, now - timedelta(hours=1))  # TTL has not deleted it yet
    _store_boost(org_scoped, "premium", 222, now + timedelta(hours=1))
    assert len(boost_items(org_scoped)) == 2
    assert len(config_item(org_scoped)[boost_store.BOOSTS_ATTRIBUTE]) == 2  # until the next boost removes it
    assert boosts.active_boosts(orgs.effective_config(org_scoped), now) == {"premium": 222}


def test_cached_boost_stops_counting_exactly_at_its_expiry(org_scoped):
    now = datetime.now(UTC)
    expiry = now + timedelta(minutes=10)
    boost_id = _store_boost(org_scoped, "economy", 500, expiry)
    assert boosts.active_boosts(orgs.effective_config(org_scoped), now) == {"economy": 500}
    table(tables.CONFIG).delete_item(
        Key={"org_key": keys.org_key(org_scoped), "resource_key": boost_items(org_scoped)[0]["resource_key"]}
    )
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(org_scoped), "resource_key": keys.ROOT_RESOURCE},
        UpdateExpression="REMOVE #boosts.#id",
        ExpressionAttributeNames={"#boosts": boost_store.BOOSTS_ATTRIBUTE, "#id": boost_id},
    )
    # still cached (the item and its entry are gone), and still counted until the expiry, not after it
    assert boosts.active_boosts(orgs.effective_config(org_scoped), expiry - timedelta(seconds=1)) == {"economy": 500}
    assert boosts.active_boosts(orgs.effective_config(org_scoped), expiry) == {}


def test_boost_keeps_a_spent_label_available_in_selection_and_aggregates(api, fold_stream):
    from tests.usage_support import iso, new_tenant, usage_body

    tenant = new_tenant(quotas={"premium": 4_000, "standard": 5_000_000, "economy": 2_000_000})
    for _ in range(2):  # 2 x 3,760 µ$: premium is past its 4,000 µ$ quota
        assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    fold_stream()
    boost = {
        "model_label": "premium",
        "amount_usd_micros": 10_000,
        "app_id": tenant.app_id,
        "expires_at": iso(datetime.now(UTC) + timedelta(days=1)),
    }
    assert api.post(f"{tenant.org_path}/quota-boosts", boost, api_key=PROVISIONING_KEY).status == 201

    selection = api.get(f"{tenant.app_path}/model-selection", token=tenant.token).json()
    assert selection["recommended_model"]["label"] == "premium"
    assert selection["quota_status"]["models_status"]["premium"]["quota_usd_micros"] == 14_000
    today = api.get(f"{tenant.app_path}/aggregates/today", token=tenant.token).json()
    assert today["models"]["premium"]["quota_usd_micros"] == 14_000
    assert today["models"]["premium"]["cost_usd_micros"] == 7_520


# --- kept on the scope's item -------------------------------------------------------


def _read_calls() -> list[str]:
    calls: list[str] = []
    ddb_client().meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    return calls


def test_a_new_apps_boosts_come_with_its_config_and_cost_no_call_of_their_own(api):
    org_id, _ = new_org(api)
    new_app(api, org_id, "app-1")
    body = {"model_label": "economy", "amount_usd_micros": 42, "expires_at": _in(hours=2), "app_id": "app-1"}
    reply = post_boost(api, org_id, body)
    assert reply.status == 201, reply
    stored = config_item(org_id, "app-1")[boost_store.BOOSTS_ATTRIBUTE]
    expires = int(datetime.fromisoformat(body["expires_at"]).timestamp())
    assert stored == {reply.json()["boost_id"]: ["economy", 42, expires]}
    assert [item["boost_id"] for item in boost_items(org_id)] == [reply.json()["boost_id"]]  # and its own item
    orgs.forget(org_id)
    calls = _read_calls()
    config = boosts.boosted_config(org_id, "app-1", datetime.now(UTC))
    assert calls == ["BatchGetItem"]  # the org and app items: no Query of boost items
    assert config.quotas["economy"] == orgs.effective_config(org_id, "app-1").quotas.get("economy", 0) + 42


def another_boost_between_the_read_and_the_write(monkeypatch, org_id: str, amount: int = 7) -> None:
    """The next boost request of ``org_id`` reads the scope's item, then another container's
    boost of the same quota (``standard``, ``amount``) is stored before it writes."""
    from price_keeper.store import config_items

    read = config_items.org_and_app

    def then_another_boost(*args):
        monkeypatch.setattr(config_items, "org_and_app", read)
        found = read(*args)
        other = bodies.BoostRequest(model_label="standard", amount_usd_micros=amount, expires_at=_in(hours=1))
        boosts.create(org_id, other)
        return found

    monkeypatch.setattr(config_items, "org_and_app", then_another_boost)


def test_two_boosts_racing_for_one_scope_both_count(api, org_scoped, monkeypatch):
    """Each boost SETs its own entry of the scope item's map: one written between another's
    read and write is kept, not overwritten."""
    another_boost_between_the_read_and_the_write(monkeypatch, org_scoped)
    body = {"model_label": "premium", "amount_usd_micros": 9, "expires_at": _in(hours=1)}
    assert post_boost(api, org_scoped, body).status == 201
    entries = config_item(org_scoped)[boost_store.BOOSTS_ATTRIBUTE]
    assert sorted((label, amount) for label, amount, _ in entries.values()) == [("premium", 9), ("standard", 7)]
    assert len(boost_items(org_scoped)) == 2
    orgs.forget(org_scoped)
    assert boosts.active_boosts(orgs.effective_config(org_scoped), datetime.now(UTC)) == {"premium": 9, "standard": 7}


def test_a_boost_racing_another_for_the_last_room_reads_again_and_is_refused(api, org_scoped, monkeypatch):
    """The map's size is the transaction's condition: a boost whose read saw room that
    another boost took meanwhile is cancelled, reads the item again, and is refused (the
    quota holds at most ``MAX_ACTIVE_BOOSTS``); nothing of it is written."""
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    for _ in range(boosts.MAX_ACTIVE_BOOSTS - 1):
        assert post_boost(api, org_scoped, body).status == 201
    another_boost_between_the_read_and_the_write(monkeypatch, org_scoped)
    refused = assert_error(post_boost(api, org_scoped, body), 400, "INVALID_REQUEST")
    assert refused["details"] == {"limit": 20, "active": 20}
    entries = config_item(org_scoped)[boost_store.BOOSTS_ATTRIBUTE]
    assert sorted(label for label, _, _ in entries.values()) == ["premium"] * 19 + ["standard"]
    assert len(boost_items(org_scoped)) == 20


def test_a_quota_holds_at_most_20_active_boosts_and_expired_ones_leave_its_item(api, org_scoped, monkeypatch):
    body = {"model_label": "premium", "amount_usd_micros": 1, "expires_at": _in(hours=1)}
    for _ in range(boosts.MAX_ACTIVE_BOOSTS):
        assert post_boost(api, org_scoped, body).status == 201
    before = config_item(org_scoped)
    refused = assert_error(post_boost(api, org_scoped, body), 400, "INVALID_REQUEST")
    assert refused["details"] == {"limit": 20, "active": 20}
    assert config_item(org_scoped) == before and len(boost_items(org_scoped)) == 20  # nothing written
    later = datetime.now(UTC) + timedelta(hours=2)  # every one of them expired
    monkeypatch.setattr(boosts, "datetime", type("Later", (datetime,), {"now": staticmethod(lambda tz=None: later)}))
    body["expires_at"] = _iso(later + timedelta(hours=1))
    reply = post_boost(api, org_scoped, body)
    assert reply.status == 201, reply
    assert list(config_item(org_scoped)[boost_store.BOOSTS_ATTRIBUTE]) == [reply.json()["boost_id"]]
