"""POST .../credentials/rotate: a new secret, the old one kept for the grace period only."""
import uuid

import bcrypt
import pytest

from price_keeper import auth, keys, tables
from price_keeper.aws import table
from price_keeper.errors import ApiError
from tests.conftest import PROVISIONING_KEY, assert_error
from tests.provisioned import config_item, get_tokens, new_app, new_org, tokens

HOUR = 3600


def rotate(api, org_id: str, app_id: str | None = None, body=None, api_key: str | None = PROVISIONING_KEY):
    path = f"/api/v1/orgs/{org_id}" + (f"/apps/{app_id}" if app_id else "") + "/credentials/rotate"
    return api.post(path, body, api_key=api_key)


def with_secret(credentials: dict, secret: str) -> dict:
    return {**credentials, "client_secret": secret}


def end_grace_period(org_id: str, app_id: str | None = None) -> None:
    """Time passes: the stored grace expiry is now in the past."""
    resource = keys.app_resource(app_id) if app_id else keys.ROOT_RESOURCE
    table(tables.CONFIG).update_item(
        Key={"org_key": keys.org_key(org_id), "resource_key": resource},
        UpdateExpression="SET client_secret_rotation_grace_expires_at_epoch = :past",
        ExpressionAttributeValues={":past": 1_000_000_000})


def test_org_rotation_reply_and_both_secrets_inside_the_grace_period(api):
    org_id, old = new_org(api)
    reply = rotate(api, org_id, body={"grace_period_hours": 24})
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"org_id", "client_id", "client_secret", "rotation"}
    assert body["org_id"] == org_id and body["client_id"] == old["client_id"]
    assert body["client_secret"] != old["client_secret"]
    rotation = body["rotation"]
    assert rotation["grace_period_hours"] == 24
    stored = config_item(org_id)
    assert stored["client_secret_rotation_grace_expires_at_epoch"] == stored["client_secret_created_at_epoch"] + 24 * HOUR
    assert rotation["rotated_at"].endswith("Z") and rotation["old_secret_expires_at"] > rotation["rotated_at"]
    tokens(api, old)
    tokens(api, with_secret(old, body["client_secret"]))


def test_old_secret_is_refused_once_the_grace_period_is_over(api):
    org_id, old = new_org(api)
    new_secret = rotate(api, org_id, body={"grace_period_hours": 1}).json()["client_secret"]
    tokens(api, old)
    end_grace_period(org_id)
    assert_error(get_tokens(api, old), 401, "UNAUTHORIZED")
    tokens(api, with_secret(old, new_secret))


def test_grace_period_ends_exactly_at_its_expiry(api):
    org_id, old = new_org(api)
    rotate(api, org_id, body={"grace_period_hours": 2})
    expiry = int(config_item(org_id)["client_secret_rotation_grace_expires_at_epoch"])
    assert auth.authenticate_client(old["client_id"], old["client_secret"], now=expiry - 1).org_id == org_id
    with pytest.raises(ApiError) as refused:
        auth.authenticate_client(old["client_id"], old["client_secret"], now=expiry)
    assert refused.value.status == 401


def test_zero_grace_stops_the_old_secret_at_once(api):
    org_id, old = new_org(api)
    body = rotate(api, org_id, body={"grace_period_hours": 0}).json()
    assert body["rotation"]["old_secret_expires_at"] == body["rotation"]["rotated_at"]
    assert_error(get_tokens(api, old), 401, "UNAUTHORIZED")
    tokens(api, with_secret(old, body["client_secret"]))
    stored = config_item(org_id)
    assert "previous_client_secret_hash" not in stored
    assert "client_secret_rotation_grace_expires_at_epoch" not in stored


@pytest.mark.parametrize("body", [None, {}])
def test_grace_period_defaults_to_168_hours(api, body):
    org_id, old = new_org(api)
    reply = rotate(api, org_id, body=body)
    assert reply.status == 200, reply
    assert reply.json()["rotation"]["grace_period_hours"] == 168
    stored = config_item(org_id)
    assert stored["client_secret_rotation_grace_expires_at_epoch"] - stored["client_secret_created_at_epoch"] == 168 * HOUR
    tokens(api, old)


def test_168_hours_is_accepted(api):
    org_id, _ = new_org(api)
    assert rotate(api, org_id, body={"grace_period_hours": 168}).status == 200


@pytest.mark.parametrize("body", [
    {"grace_period_hours": -1}, {"grace_period_hours": 169}, {"grace_period_hours": "24"},
    {"grace_period_hours": 1.5}, {"grace_period_hours": True}, {"grace_period_hours": None},
    {"grace_period_hours": 24, "reason": "leak"}, "{not json", [],
])
def test_invalid_grace_period_is_400_and_changes_nothing(api, body):
    org_id, old = new_org(api)
    before = config_item(org_id)
    assert_error(rotate(api, org_id, body=body), 400, "INVALID_REQUEST")
    assert config_item(org_id) == before
    tokens(api, old)


def test_app_rotation_changes_the_app_secret_only(api):
    org_id, org_credentials = new_org(api)
    app_old = new_app(api, org_id, "app-1")
    reply = rotate(api, org_id, "app-1", {"grace_period_hours": 0})
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"org_id", "app_id", "client_id", "client_secret", "rotation"}
    assert (body["org_id"], body["app_id"], body["client_id"]) == (org_id, "app-1", app_old["client_id"])
    assert_error(get_tokens(api, app_old), 401, "UNAUTHORIZED")
    tokens(api, with_secret(app_old, body["client_secret"]))
    tokens(api, org_credentials)


def test_app_old_secret_works_in_grace_and_not_after(api):
    org_id, _ = new_org(api)
    app_old = new_app(api, org_id, "app-1")
    rotate(api, org_id, "app-1", {"grace_period_hours": 5})
    tokens(api, app_old)
    end_grace_period(org_id, "app-1")
    assert_error(get_tokens(api, app_old), 401, "UNAUTHORIZED")


def test_a_second_rotation_ends_the_first_secret(api):
    org_id, first = new_org(api)
    second = rotate(api, org_id).json()["client_secret"]
    third = rotate(api, org_id).json()["client_secret"]
    assert_error(get_tokens(api, first), 401, "UNAUTHORIZED")
    tokens(api, with_secret(first, second))
    tokens(api, with_secret(first, third))


def test_rotated_secrets_are_stored_only_as_bcrypt_hashes(api):
    org_id, old = new_org(api)
    new_secret = rotate(api, org_id).json()["client_secret"]
    stored = config_item(org_id)
    assert old["client_secret"] not in repr(stored) and new_secret not in repr(stored)
    assert bcrypt.checkpw(new_secret.encode(), stored["client_secret_hash"].encode())
    assert bcrypt.checkpw(old["client_secret"].encode(), stored["previous_client_secret_hash"].encode())


def test_rotation_of_unknown_org_or_app_is_404(api):
    assert_error(rotate(api, str(uuid.uuid4())), 404, "NOT_FOUND")
    org_id, _ = new_org(api)
    body = assert_error(rotate(api, org_id, "no-such-app"), 404, "NOT_FOUND")
    assert body["details"] == {"org_id": org_id, "app_id": "no-such-app"}
    assert config_item(org_id, "no-such-app") is None


@pytest.mark.parametrize("org_id,app_id", [("not-a-uuid", None), ("550e8400-e29b-41d4-a716-446655440000", "bad#app")])
def test_rotation_ids_are_validated(api, org_id, app_id):
    assert_error(rotate(api, org_id, app_id.replace("#", "%23") if app_id else None), 400, "INVALID_REQUEST")


@pytest.mark.parametrize("api_key", [None, "wrong-key"])
def test_rotation_needs_the_provisioning_key(api, api_key):
    org_id, old = new_org(api)
    before = config_item(org_id)
    assert_error(rotate(api, org_id, api_key=api_key), 401, "UNAUTHORIZED")
    app_credentials = new_app(api, org_id, "app-1")
    app_before = config_item(org_id, "app-1")
    assert_error(rotate(api, org_id, "app-1", api_key=api_key), 401, "UNAUTHORIZED")
    assert config_item(org_id) == before and config_item(org_id, "app-1") == app_before
    tokens(api, old)
    tokens(api, app_credentials)
