"""POST .../credentials/rotate: a new secret, the old one kept for the grace period only,
and the tokens the old secret obtained ending with it."""

import itertools
import time
import uuid
from datetime import datetime, timedelta
from types import SimpleNamespace

import bcrypt
import jwt
import pytest

from price_keeper import state
from price_keeper.domain import auth
from price_keeper.errors import ApiError
from price_keeper.store import keys, tables
from price_keeper.store.dynamo import table
from tests.conftest import PROVISIONING_KEY, assert_error
from tests.provisioned import accepted, claims_of, config_item, get_tokens, new_app, new_org, refresh, tokens

HOUR = 3600
ADDRESS = "192.0.2.1"


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
        ExpressionAttributeValues={":past": 1_000_000_000},
    )


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
    assert (
        stored["client_secret_rotation_grace_expires_at_epoch"] == stored["client_secret_created_at_epoch"] + 24 * HOUR
    )
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
    client = auth.authenticate_client(old["client_id"], old["client_secret"], source_ip=ADDRESS, now=expiry - 1)
    assert client == (auth.Principal(org_id, None), expiry)  # its tokens may not outlive the grace period
    with pytest.raises(ApiError) as refused:
        auth.authenticate_client(old["client_id"], old["client_secret"], source_ip=ADDRESS, now=expiry)
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
    assert (
        stored["client_secret_rotation_grace_expires_at_epoch"] - stored["client_secret_created_at_epoch"] == 168 * HOUR
    )
    tokens(api, old)


def test_168_hours_is_accepted(api):
    org_id, _ = new_org(api)
    assert rotate(api, org_id, body={"grace_period_hours": 168}).status == 200


@pytest.mark.parametrize(
    "body",
    [
        {"grace_period_hours": -1},
        {"grace_period_hours": 169},
        {"grace_period_hours": "24"},
        {"grace_period_hours": 1.5},
        {"grace_period_hours": True},
        {"grace_period_hours": None},
        {"grace_period_hours": 24, "reason": "leak"},
        "{not json",
        [],
    ],
)
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


# --- one bcrypt check per attempt ----------------------------------------------------------


@pytest.fixture
def bcrypt_checks(monkeypatch) -> list:
    checks = []
    real = auth.bcrypt.checkpw

    def counted(password, hashed):
        checks.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(auth.bcrypt, "checkpw", counted)
    return checks


def test_every_attempt_costs_one_bcrypt_check_in_a_grace_period_too(api, bcrypt_checks):
    org_id, old = new_org(api)
    new = with_secret(old, rotate(api, org_id, body={"grace_period_hours": 24}).json()["client_secret"])
    attempts = {
        "wrong secret": (with_secret(old, "wrong"), 401),
        "old secret": (old, 200),
        "new secret": (new, 200),
        "unknown client": ({**old, "client_id": f"org-{uuid.uuid4()}"}, 401),
    }
    for name, (credentials, status) in attempts.items():
        bcrypt_checks.clear()
        assert get_tokens(api, credentials).status == status, name
        assert len(bcrypt_checks) == 1, name


def test_a_new_secret_never_has_the_current_secrets_fingerprint(api, monkeypatch):
    """The fingerprint picks the hash to check, so the two secrets of a grace period must
    differ in it: a colliding new secret is drawn again."""
    org_id, old = new_org(api)
    current = config_item(org_id)["client_secret_fingerprint"]
    colliding = next(
        secret for secret in (f"collide-{n}" for n in itertools.count()) if auth.secret_fingerprint(secret) == current
    )
    drawn = iter([colliding, "distinct-secret"])
    monkeypatch.setattr(auth, "new_client_secret", lambda: next(drawn))
    body = rotate(api, org_id, body={"grace_period_hours": 24}).json()
    assert body["client_secret"] == "distinct-secret"
    stored = config_item(org_id)
    assert stored["client_secret_fingerprint"] == auth.secret_fingerprint("distinct-secret") != current
    assert stored["previous_client_secret_fingerprint"] == current
    tokens(api, old)
    tokens(api, with_secret(old, "distinct-secret"))


# --- tokens already issued end with the secret that obtained them --------------------------


class Later:
    """The service's clock ``seconds`` ahead (tokens' expiry checks included)."""

    def __init__(self, monkeypatch, seconds: int):
        real = time.time
        monkeypatch.setattr(
            auth, "time", SimpleNamespace(time=lambda: real() + seconds, time_ns=lambda: int((real() + seconds) * 1e9))
        )
        monkeypatch.setattr(jwt.api_jwt, "datetime", _ShiftedDatetime(seconds))
        state.reset()  # the revocation cache window has long passed


def _ShiftedDatetime(seconds: int):
    class Shifted(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(seconds=seconds)

    return Shifted


def test_rotation_without_grace_ends_the_tokens_already_issued(api):
    org_id, old = new_org(api)
    issued = tokens(api, old)
    new = with_secret(old, rotate(api, org_id, body={"grace_period_hours": 0}).json()["client_secret"])
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")
    assert not accepted(issued["access_token"], org_id)
    fresh = tokens(api, new)  # in the same second as the rotation
    assert accepted(fresh["access_token"], org_id)
    assert refresh(api, fresh["refresh_token"]).status == 200


def test_old_secrets_tokens_end_when_the_grace_period_does(api, monkeypatch):
    org_id, old = new_org(api)
    before = tokens(api, old)
    body = rotate(api, org_id, body={"grace_period_hours": 2}).json()
    new = with_secret(old, body["client_secret"])
    grace_end = int(config_item(org_id)["client_secret_rotation_grace_expires_at_epoch"])
    during = tokens(api, old)  # the old secret still obtains tokens, but only until the grace ends
    assert claims_of(during["refresh_token"])["exp"] == grace_end
    assert during["refresh_expires_in"] <= 2 * HOUR and claims_of(during["access_token"])["exp"] <= grace_end
    from_new = tokens(api, new)
    assert from_new["refresh_expires_in"] == 7 * 24 * HOUR
    assert refresh(api, before["refresh_token"]).status == 200  # within the grace period
    assert accepted(before["access_token"], org_id)

    Later(monkeypatch, 2 * HOUR + 1)
    assert_error(refresh(api, before["refresh_token"]), 401, "UNAUTHORIZED")
    assert_error(refresh(api, during["refresh_token"]), 401, "UNAUTHORIZED")
    assert_error(get_tokens(api, old), 401, "UNAUTHORIZED")
    assert refresh(api, from_new["refresh_token"]).status == 200


def test_rotating_again_in_a_grace_period_ends_the_oldest_secrets_tokens_at_once(api):
    org_id, first = new_org(api)
    first_session = tokens(api, first)
    second = with_secret(first, rotate(api, org_id, body={"grace_period_hours": 24}).json()["client_secret"])
    second_session = tokens(api, second)
    rotate(api, org_id, body={"grace_period_hours": 24})
    assert_error(refresh(api, first_session["refresh_token"]), 401, "UNAUTHORIZED")
    assert refresh(api, second_session["refresh_token"]).status == 200  # its own grace period runs
