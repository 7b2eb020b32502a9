"""POST /auth/token, /auth/refresh, /auth/revoke and the authorizer step of runtime
endpoints: real tokens, real signatures, revocation stored in DynamoDB (moto)."""

import base64
import json
import time
import uuid
from types import SimpleNamespace

import jwt
import pytest

from local.gateway import LambdaContext, api_event
from price_keeper import cache, state
from price_keeper.aws import secrets as secrets_store
from price_keeper.domain import auth
from price_keeper.errors import ApiError
from price_keeper.metric_names import CLIENT_TOKENS_REVOKED, TOKENS_REVOKED
from price_keeper.store import dynamo, tables
from price_keeper.store.dynamo import ddb_client, table
from tests.conftest import PROVISIONING_KEY, assert_error, cold_handler
from tests.provisioned import ORG_BODY, accepted, authorize, claims_of, get_tokens, new_app, new_org, refresh, tokens


@pytest.fixture
def org(api):
    org_id, credentials = new_org(api)
    return org_id, credentials


@pytest.fixture
def app_client(api, org):
    org_id, _ = org
    return org_id, new_app(api, org_id, "app-production-api")


def revoke(api, token: str, bearer: str, hint: str | None = None):
    body = {"token": token} | ({"token_type_hint": hint} if hint else {})
    return api.post("/auth/revoke", body, token=bearer)


def forge(claims: dict, key: str | None = None, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key or secrets_store.signing_key(), algorithm=algorithm)


def access_claims(org_id: str, app_id: str | None, **changes) -> dict:
    now = int(time.time())
    return {
        "sub": auth.client_id_for(org_id, app_id),
        "org_id": org_id,
        "app_id": app_id,
        "scope": auth.ACCESS_SCOPES,
        "token_type": "access",
        "iat": now,
        "exp": now + 3600,
        "iss": auth.ISSUER,
        "jti": str(uuid.uuid4()),
        **changes,
    }


def expired_access_token(org_id: str) -> str:
    """A well-signed access token of the app "app-production-api" that expired an hour ago."""
    past = int(time.time()) - 7200
    return forge(access_claims(org_id, "app-production-api", iat=past, exp=past + 3600))


# --- POST /auth/token ------------------------------------------------------------------


def test_app_token_has_the_spec_body_and_claims(api, app_client):
    org_id, credentials = app_client
    reply = get_tokens(api, credentials)
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"access_token", "refresh_token", "token_type", "expires_in", "refresh_expires_in", "scope"}
    assert (body["token_type"], body["expires_in"], body["refresh_expires_in"]) == ("Bearer", 3600, 604800)
    assert body["scope"] == f"org:{org_id} app:app-production-api"
    access = claims_of(body["access_token"])
    assert access["sub"] == f"org-{org_id}-app-app-production-api"
    assert (access["org_id"], access["app_id"], access["token_type"]) == (org_id, "app-production-api", "access")
    assert access["scope"] == ["read:aggregates", "write:costs", "read:model-selection"]
    assert access["exp"] - access["iat"] == 3600 and access["iss"] == "bedrock-cost-keeper"
    assert jwt.get_unverified_header(body["access_token"])["alg"] == "HS256"
    refresh_claims = claims_of(body["refresh_token"])
    assert refresh_claims["token_type"] == "refresh" and refresh_claims["sub"] == access["sub"]
    assert refresh_claims["exp"] - refresh_claims["iat"] == 604800
    assert access["rjti"] == refresh_claims["jti"]


def test_org_token_is_scoped_to_the_org(api, org):
    org_id, credentials = org
    body = tokens(api, credentials)
    assert body["scope"] == f"org:{org_id}"
    assert claims_of(body["access_token"])["app_id"] is None


@pytest.mark.parametrize(
    "change",
    [
        {"client_secret": "wrong"},
        {"client_secret": "é" * 80},  # beyond bcrypt's 72 bytes: still a plain 401
        {"client_id": f"org-{uuid.uuid4()}"},
        {"client_id": "not-a-client-id"},
        {"client_id": "org-"},
    ],
)
def test_bad_credentials_are_401(api, app_client, change):
    _, credentials = app_client
    assert_error(get_tokens(api, {**credentials, **change}), 401, "UNAUTHORIZED")


def test_an_app_secret_does_not_open_the_org_client(api, org, app_client):
    org_id, org_credentials = org
    _, app_credentials = app_client
    mixed = {"client_id": org_credentials["client_id"], "client_secret": app_credentials["client_secret"]}
    assert_error(get_tokens(api, mixed), 401, "UNAUTHORIZED")


MALFORMED = {
    "/auth/token": [
        {"client_id": "x", "client_secret": "y", "grant_type": "password"},
        {"client_id": "x", "client_secret": "y"},
        {"client_secret": "y", "grant_type": "client_credentials"},
        {"client_id": 5, "client_secret": "y", "grant_type": "client_credentials"},
        {"client_id": "x", "client_secret": "y", "grant_type": "client_credentials", "scope": "all"},
        {"client_id": "x" * 257, "client_secret": "y", "grant_type": "client_credentials"},
        "{broken",
        "",
    ],
    "/auth/refresh": [
        {"refresh_token": "x", "grant_type": "client_credentials"},
        {"grant_type": "refresh_token"},
        {"refresh_token": ["x"], "grant_type": "refresh_token"},
        {"refresh_token": "x" * 5000, "grant_type": "refresh_token"},
        "nope",
    ],
}


@pytest.mark.parametrize("path,body", [(path, body) for path, bodies in MALFORMED.items() for body in bodies])
def test_malformed_token_and_refresh_requests_are_400(api, path, body):
    assert_error(api.post(path, body), 400, "INVALID_REQUEST")


# --- POST /auth/refresh ------------------------------------------------------------------


def test_refresh_gives_a_new_working_access_token(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    reply = refresh(api, issued["refresh_token"])
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"access_token", "token_type", "expires_in"}
    assert (body["token_type"], body["expires_in"]) == ("Bearer", 3600)
    assert body["access_token"] != issued["access_token"]
    assert accepted(body["access_token"], org_id, "app-production-api")
    assert claims_of(body["access_token"])["rjti"] == claims_of(issued["refresh_token"])["jti"]


def test_refresh_token_can_be_reused_until_it_expires(api, app_client):
    _, credentials = app_client
    issued = tokens(api, credentials)
    assert refresh(api, issued["refresh_token"]).status == 200
    assert refresh(api, issued["refresh_token"]).status == 200


def test_access_token_used_as_refresh_token_is_401(api, app_client):
    _, credentials = app_client
    assert_error(refresh(api, tokens(api, credentials)["access_token"]), 401, "UNAUTHORIZED")


# --- tokens the authorizer refuses --------------------------------------------------------


def test_refresh_token_used_as_access_token_is_401(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert not accepted(issued["refresh_token"], org_id, "app-production-api")
    assert_error(revoke(api, issued["refresh_token"], bearer=issued["refresh_token"]), 401, "UNAUTHORIZED")


def test_expired_token_is_401(api, app_client):
    org_id, _ = app_client
    expired = expired_access_token(org_id)
    assert not accepted(expired, org_id, "app-production-api")
    assert_error(revoke(api, expired, bearer=expired), 401, "UNAUTHORIZED")


def test_tampered_token_is_401(api, app_client):
    org_id, credentials = app_client
    access = tokens(api, credentials)["access_token"]
    header, payload, signature = access.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["org_id"] = str(uuid.uuid4())
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    assert not accepted(f"{header}.{forged_payload}.{signature}", claims["org_id"], "app-production-api")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    assert not accepted(f"{header}.{payload}.{flipped}", org_id, "app-production-api")


def test_alg_none_token_is_401(api, app_client):
    org_id, _ = app_client
    unsigned = jwt.encode(access_claims(org_id, "app-production-api"), None, algorithm="none")
    assert not accepted(unsigned, org_id, "app-production-api")
    assert_error(revoke(api, unsigned, bearer=unsigned), 401, "UNAUTHORIZED")


@pytest.mark.parametrize(
    "token",
    [
        "forged-with-another-key",
        "wrong-issuer",
        "no-jti",
        "sub-does-not-match-claims",
        "not-a-jwt",
    ],
)
def test_other_invalid_tokens_are_401(api, app_client, token):
    org_id, _ = app_client
    claims = access_claims(org_id, "app-production-api")
    tokens_by_case = {
        "forged-with-another-key": lambda: forge(claims, key="guessed-signing-key-of-32-bytes!"),
        "wrong-issuer": lambda: forge({**claims, "iss": "someone-else"}),
        "no-jti": lambda: forge({k: v for k, v in claims.items() if k != "jti"}),
        "sub-does-not-match-claims": lambda: forge({**claims, "sub": f"org-{uuid.uuid4()}"}),
        "not-a-jwt": lambda: "abc.def",
    }
    assert not accepted(tokens_by_case[token](), org_id, "app-production-api")


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer ", "Basic abc", "token-without-scheme"])
def test_missing_or_malformed_authorization_is_401(api, app_client, authorization):
    org_id, credentials = app_client
    refresh_token = tokens(api, credentials)["refresh_token"]
    headers = {} if authorization is None else {"Authorization": authorization}
    assert_error(api.post("/auth/revoke", {"token": refresh_token}, headers=headers), 401, "UNAUTHORIZED")
    with pytest.raises(ApiError) as refused:
        authorize(authorization, org_id, "app-production-api")
    assert refused.value.status == 401


# --- cross-tenant access ---------------------------------------------------------------------


def test_app_token_is_403_on_another_app_and_on_org_level_resources(api, app_client):
    org_id, credentials = app_client
    access = tokens(api, credentials)["access_token"]
    assert authorize(f"Bearer {access}", org_id, "app-production-api")["app_id"] == "app-production-api"
    for app_id in ("other-app", None):
        with pytest.raises(ApiError) as refused:
            authorize(f"Bearer {access}", org_id, app_id)
        assert refused.value.status == 403 and refused.value.code == "FORBIDDEN"


def test_org_token_acts_on_its_apps_but_not_on_another_org(api, org):
    org_id, credentials = org
    access = tokens(api, credentials)["access_token"]
    assert authorize(f"Bearer {access}", org_id)["org_id"] == org_id
    assert authorize(f"Bearer {access}", org_id, "any-app")["org_id"] == org_id
    with pytest.raises(ApiError) as refused:
        authorize(f"Bearer {access}", str(uuid.uuid4()))
    assert refused.value.status == 403


def test_a_client_cannot_revoke_another_clients_token(api, app_client):
    org_id, credentials = app_client
    other_org, other_credentials = new_org(api)
    victim = tokens(api, credentials)
    attacker = tokens(api, other_credentials)["access_token"]
    assert_error(revoke(api, victim["refresh_token"], bearer=attacker), 403, "FORBIDDEN")
    sibling = tokens(api, new_app(api, org_id, "sibling-app"))["access_token"]
    assert_error(revoke(api, victim["refresh_token"], bearer=sibling), 403, "FORBIDDEN")
    assert refresh(api, victim["refresh_token"]).status == 200


# --- POST /auth/revoke -------------------------------------------------------------------------


def test_revoking_a_refresh_token_ends_it_and_the_access_tokens_issued_from_it(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    refreshed = refresh(api, issued["refresh_token"]).json()["access_token"]
    other_session = tokens(api, credentials)
    reply = revoke(api, issued["refresh_token"], bearer=issued["access_token"], hint="refresh_token")
    assert reply.status == 204 and reply.text == ""
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")
    assert not accepted(issued["access_token"], org_id, "app-production-api")
    assert not accepted(refreshed, org_id, "app-production-api")
    assert accepted(other_session["access_token"], org_id, "app-production-api")


def test_revoking_an_access_token_ends_only_that_token(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert revoke(api, issued["access_token"], bearer=issued["access_token"]).status == 204
    assert not accepted(issued["access_token"], org_id, "app-production-api")
    fresh = refresh(api, issued["refresh_token"])
    assert fresh.status == 200
    assert accepted(fresh.json()["access_token"], org_id, "app-production-api")


def test_revocation_is_stored_with_the_token_expiry_as_ttl(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert revoke(api, issued["refresh_token"], bearer=issued["access_token"]).status == 204
    claims = claims_of(issued["refresh_token"])
    item = table(tables.REVOKED_TOKENS).get_item(Key={"token_jti": claims["jti"]})["Item"]
    assert item[tables.TTL_ATTRIBUTE] == claims["exp"]
    assert item["token_type"] == "refresh" and item["client_id"] == claims["sub"]
    assert issued["refresh_token"] not in repr(item)


def test_revocation_reaches_a_process_with_empty_caches(api, app_client):
    """Another Lambda container (no in-memory answers) reads the revocation from DynamoDB."""
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert accepted(issued["access_token"], org_id, "app-production-api")  # now cached as "not revoked"
    revoke(api, issued["refresh_token"], bearer=issued["access_token"])
    state.reset()
    assert not accepted(issued["access_token"], org_id, "app-production-api")
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")


@pytest.fixture
def revoker(api, app_client) -> tuple[str, dict, str]:
    """(org id, a token pair of the app, another access token of the app to revoke it with)."""
    org_id, credentials = app_client
    return org_id, tokens(api, credentials), tokens(api, credentials)["access_token"]


def test_revoking_twice_or_an_expired_token_is_204(api, revoker):
    org_id, issued, other = revoker
    for _ in range(2):
        assert revoke(api, issued["refresh_token"], bearer=other).status == 204
    assert revoke(api, expired_access_token(org_id), bearer=other).status == 204


def test_each_stored_revocation_is_counted(api, revoker, emitted_metrics):
    org_id, issued, other = revoker
    for token in (issued["refresh_token"], issued["access_token"]):
        assert revoke(api, token, bearer=other).status == 204
    assert revoke(api, expired_access_token(org_id), bearer=other).status == 204  # nothing to store, nothing counted
    assert emitted_metrics() == {TOKENS_REVOKED: [1.0, 1.0]}


@pytest.mark.parametrize(
    "body",
    [
        {"token": "not-a-token"},
        {"token": "x", "token_type_hint": "id_token"},
        {"token_type_hint": "refresh_token"},
        {"token": 12},
        {"token": "x", "extra": 1},
        "{",
    ],
)
def test_malformed_revoke_requests_are_400(api, app_client, body):
    _, credentials = app_client
    access = tokens(api, credentials)["access_token"]
    assert_error(api.post("/auth/revoke", body, token=access), 400, "INVALID_REQUEST")


# --- secrets never reach the logs --------------------------------------------------------------


def test_secrets_never_reach_the_logs_even_with_event_logging_switched_on(api, monkeypatch, capfd, caplog):
    """POWERTOOLS_DEV and POWERTOOLS_LOGGER_LOG_EVENT would print whole events (bodies with
    secrets); the service's resolver and entry point ignore them."""
    monkeypatch.setenv("POWERTOOLS_DEV", "true")
    monkeypatch.setenv("POWERTOOLS_LOGGER_LOG_EVENT", "true")
    handlers = {name: cold_handler(name) for name in ("put_org", "auth_token", "rotate_credentials")}

    def call(method: str, path: str, body: dict, headers: dict) -> dict:
        event, function = api_event(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = handlers[function](event, LambdaContext(function_name=function))
        return json.loads(response["body"])

    org_id = str(uuid.uuid4())
    key = {"X-API-Key": PROVISIONING_KEY}
    created = call("PUT", f"/api/v1/orgs/{org_id}", ORG_BODY, key)["credentials"]
    rotated = call("POST", f"/api/v1/orgs/{org_id}/credentials/rotate", {"grace_period_hours": 1}, key)
    issued = call("POST", "/auth/token", {**created, "grant_type": "client_credentials"}, {})
    refused = call("POST", "/auth/token", {**created, "grant_type": "password"}, {})
    assert "access_token" in issued and refused["error"] == "INVALID_REQUEST"
    logged = capfd.readouterr()
    # The Powertools logger writes to the stdout it found at import (pytest's, not capfd's):
    # its records, with their extra fields (the audit lines), are checked through caplog.
    records = json.dumps([vars(record) for record in caplog.records], default=str)
    assert '"audit"' in records  # the provisioning calls were logged
    for secret in (created["client_secret"], rotated["client_secret"], PROVISIONING_KEY, issued["refresh_token"]):
        assert secret not in logged.out + logged.err + records


# --- revocation reads that DynamoDB leaves unprocessed -----------------------------------------


def leave_revocation_keys_unprocessed(monkeypatch, times: int) -> dict:
    """The next ``times`` BatchGetItem calls return every RevokedTokens key as
    ``UnprocessedKeys`` (a throttled table); other tables are read normally. Setting
    ``["n"] = 0`` on the returned counter brings the table back."""
    client = ddb_client()
    real = client.batch_get_item
    name = tables.REVOKED_TOKENS.physical_name
    left = {"n": times}

    def partial(**kwargs):
        wanted = kwargs["RequestItems"]
        if name not in wanted or left["n"] <= 0:
            return real(**kwargs)
        left["n"] -= 1
        others = {table_name: read for table_name, read in wanted.items() if table_name != name}
        reply = real(**{**kwargs, "RequestItems": others}) if others else {"Responses": {}}
        reply["UnprocessedKeys"] = {**reply.get("UnprocessedKeys", {}), name: wanted[name]}
        return reply

    monkeypatch.setattr(client, "batch_get_item", partial)
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    return left


def test_a_revocation_read_left_unprocessed_never_accepts_a_revoked_token(api, app_client, monkeypatch):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert revoke(api, issued["refresh_token"], bearer=issued["access_token"]).status == 204
    state.reset()  # another container: nothing known in memory
    throttled = leave_revocation_keys_unprocessed(monkeypatch, times=10**9)
    with pytest.raises(ApiError) as refused:
        authorize(f"Bearer {issued['access_token']}", org_id, "app-production-api")
    assert refused.value.status == 503 and refused.value.code == "SERVICE_UNAVAILABLE"
    assert_error(refresh(api, issued["refresh_token"]), 503, "SERVICE_UNAVAILABLE")
    throttled["n"] = 0
    assert not accepted(issued["access_token"], org_id, "app-production-api")


def test_unprocessed_revocation_keys_are_retried(api, app_client, monkeypatch):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert revoke(api, issued["refresh_token"], bearer=issued["access_token"]).status == 204
    state.reset()
    leave_revocation_keys_unprocessed(monkeypatch, times=2)
    assert not accepted(issued["access_token"], org_id, "app-production-api")


def test_an_incomplete_revocation_read_is_not_cached_as_not_revoked(api, app_client, monkeypatch):
    """After a failed read, a revocation made meanwhile by another container is seen at once."""
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    throttled = leave_revocation_keys_unprocessed(monkeypatch, times=10**9)
    with pytest.raises(ApiError) as refused:
        authorize(f"Bearer {issued['access_token']}", org_id, "app-production-api")
    assert refused.value.status == 503
    throttled["n"] = 0
    claims = claims_of(issued["access_token"])
    table(tables.REVOKED_TOKENS).put_item(
        Item={  # revoked by another container
            "token_jti": claims["jti"],
            "token_type": "access",
            "client_id": claims["sub"],
            "revoked_at_epoch": int(time.time()),
            "original_expiry_epoch": claims["exp"],
            tables.TTL_ATTRIBUTE: claims["exp"],
        }
    )
    assert not accepted(issued["access_token"], org_id, "app-production-api")


def test_a_cold_containers_token_check_carries_its_config_read_and_still_refuses_a_revoked_token(
    api, app_client, monkeypatch
):
    """A container that knows neither the token nor the app reads the revocations and the
    app's config in one BatchGetItem (``orgs.config_along``): a revoked token is still a
    401 over HTTP, and revocation keys left unprocessed are still a 503, never a pass."""
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    path = f"/api/v1/orgs/{org_id}/apps/app-production-api/model-selection"
    both = {tables.REVOKED_TOKENS.physical_name, tables.CONFIG.physical_name}

    def cold_container() -> list[set[str]]:
        """A container with nothing in memory; the tables each of its BatchGetItems reads."""
        state.reset()
        reads = []
        ddb_client().meta.events.register(
            "provide-client-params.dynamodb.BatchGetItem", lambda params, **_: reads.append(set(params["RequestItems"]))
        )
        return reads

    reads = cold_container()
    assert api.get(path, token=issued["access_token"]).status == 200
    assert reads[0] == both

    assert revoke(api, issued["access_token"], bearer=issued["access_token"]).status == 204
    reads = cold_container()
    assert_error(api.get(path, token=issued["access_token"]), 401, "UNAUTHORIZED")
    assert reads == [both]

    fresh = tokens(api, credentials)
    state.reset()
    leave_revocation_keys_unprocessed(monkeypatch, times=10**9)
    assert_error(api.get(path, token=fresh["access_token"]), 503, "SERVICE_UNAVAILABLE")


# --- POST .../credentials/revoke-tokens ----------------------------------------------------------


def revoke_tokens(api, org_id: str, app_id: str | None = None, body=None, api_key: str | None = PROVISIONING_KEY):
    path = f"/api/v1/orgs/{org_id}" + (f"/apps/{app_id}" if app_id else "") + "/credentials/revoke-tokens"
    return api.post(path, {} if body is None else body, api_key=api_key)


def test_revoke_tokens_ends_every_token_issued_to_the_client_before(api, org, app_client):
    org_id, org_credentials = org
    _, credentials = app_client
    first, second = tokens(api, credentials), tokens(api, credentials)
    refreshed = refresh(api, first["refresh_token"]).json()["access_token"]
    org_session = tokens(api, org_credentials)
    assert accepted(first["access_token"], org_id, "app-production-api")  # cached as not revoked here

    reply = revoke_tokens(api, org_id, "app-production-api")
    assert reply.status == 204 and reply.text == ""
    for session in (first, second):
        assert_error(refresh(api, session["refresh_token"]), 401, "UNAUTHORIZED")
    for access in (first["access_token"], second["access_token"], refreshed):
        assert not accepted(access, org_id, "app-production-api")
    assert accepted(org_session["access_token"], org_id)  # another client
    assert refresh(api, org_session["refresh_token"]).status == 200
    after = tokens(api, credentials)  # the secret still works, in the same second too
    assert accepted(after["access_token"], org_id, "app-production-api")
    assert refresh(api, after["refresh_token"]).status == 200


def test_revoke_tokens_of_an_org_client(api, org):
    org_id, credentials = org
    issued = tokens(api, credentials)
    assert revoke_tokens(api, org_id).status == 204
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")
    assert not accepted(issued["access_token"], org_id)
    assert accepted(tokens(api, credentials)["access_token"], org_id)


def revoke_tokens_elsewhere(client_id: str) -> None:
    """revoke-tokens handled by another container: the cutoff is stored, this container's
    cached answers are untouched."""
    ddb_client().transact_write_items(TransactItems=[auth.cutoff_update(client_id, auth.now_ms())])


def test_another_container_refuses_access_tokens_within_the_cache_window(api, app_client, monkeypatch):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert accepted(issued["access_token"], org_id, "app-production-api")  # this container caches the answer
    revoke_tokens_elsewhere(credentials["client_id"])
    assert accepted(issued["access_token"], org_id, "app-production-api")  # cached, for at most 30 s
    real = time.monotonic
    monkeypatch.setattr(cache, "time", SimpleNamespace(monotonic=lambda: real() + auth.REVOCATION_CACHE_SECONDS + 1))
    assert not accepted(issued["access_token"], org_id, "app-production-api")


def test_another_container_refuses_refresh_tokens_at_once(api, app_client):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert accepted(issued["access_token"], org_id, "app-production-api")  # the client's cutoff is cached
    revoke_tokens_elsewhere(credentials["client_id"])
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")  # the refresh reads it fresh


def test_tokens_without_a_millisecond_claim_are_judged_by_their_issue_second(api, app_client):
    org_id, credentials = app_client
    earlier = forge(access_claims(org_id, "app-production-api", iat=int(time.time()) - 1))
    assert accepted(earlier, org_id, "app-production-api")
    assert revoke_tokens(api, org_id, "app-production-api").status == 204
    assert not accepted(earlier, org_id, "app-production-api")


def test_refreshed_access_tokens_belong_to_their_session(api, app_client):
    """An access token minted by /auth/refresh carries the session's authentication time, so
    a refresh racing a revoke-tokens cannot mint a token that outlives it; nor does it
    outlive its refresh token."""
    _, credentials = app_client
    issued = tokens(api, credentials)
    refreshed = refresh(api, issued["refresh_token"]).json()
    session = claims_of(issued["refresh_token"])
    access = claims_of(refreshed["access_token"])
    assert access["auth_time_ms"] == session["auth_time_ms"] == claims_of(issued["access_token"])["auth_time_ms"]
    assert access["exp"] <= session["exp"]


def test_revoke_tokens_stores_one_cutoff_item_that_expires_with_the_last_token_it_refuses(api, app_client):
    org_id, credentials = app_client
    before = auth.now_ms()
    assert revoke_tokens(api, org_id, "app-production-api").status == 204
    item = table(tables.REVOKED_TOKENS).get_item(Key={"token_jti": f"CLIENT#{credentials['client_id']}"})["Item"]
    assert before <= item["cutoff_ms"] <= auth.now_ms()
    assert item[tables.TTL_ATTRIBUTE] == item["cutoff_ms"] // 1000 + auth.REFRESH_TTL
    assert item["client_id"] == credentials["client_id"]


def test_revoke_tokens_of_an_unknown_org_or_app_is_404_and_stores_nothing(api, org):
    org_id, _ = org
    unknown_org = str(uuid.uuid4())
    assert_error(revoke_tokens(api, unknown_org), 404, "NOT_FOUND")
    body = assert_error(revoke_tokens(api, org_id, "no-such-app"), 404, "NOT_FOUND")
    assert body["details"] == {"org_id": org_id, "app_id": "no-such-app"}
    for client_id in (f"org-{unknown_org}", f"org-{org_id}-app-no-such-app"):
        assert "Item" not in table(tables.REVOKED_TOKENS).get_item(Key={"token_jti": f"CLIENT#{client_id}"})


def test_revoke_tokens_is_counted_when_it_stores_a_cutoff(api, org, emitted_metrics):
    org_id, _ = org
    assert revoke_tokens(api, org_id).status == 204
    assert_error(revoke_tokens(api, str(uuid.uuid4())), 404, "NOT_FOUND")
    assert emitted_metrics() == {CLIENT_TOKENS_REVOKED: [1.0]}


@pytest.mark.parametrize("api_key", [None, "wrong-key"])
def test_revoke_tokens_needs_the_provisioning_key(api, app_client, api_key):
    org_id, credentials = app_client
    issued = tokens(api, credentials)
    assert_error(revoke_tokens(api, org_id, "app-production-api", api_key=api_key), 401, "UNAUTHORIZED")
    assert_error(revoke_tokens(api, org_id, "app-production-api", api_key=issued["access_token"]), 401, "UNAUTHORIZED")
    assert refresh(api, issued["refresh_token"]).status == 200


@pytest.mark.parametrize(
    "org_id,app_id,body",
    [
        ("not-a-uuid", None, {}),
        ("550e8400-e29b-41d4-a716-446655440000", "bad%23app", {}),
        ("550e8400-e29b-41d4-a716-446655440000", None, {"grace_period_hours": 0}),
        ("550e8400-e29b-41d4-a716-446655440000", None, "[]"),
    ],
)
def test_malformed_revoke_tokens_requests_are_400(api, org_id, app_id, body):
    assert_error(revoke_tokens(api, org_id, app_id, body=body), 400, "INVALID_REQUEST")


def test_revoke_tokens_without_a_body_is_fine(api, org):
    org_id, credentials = org
    issued = tokens(api, credentials)
    reply = api.post(f"/api/v1/orgs/{org_id}/credentials/revoke-tokens", api_key=PROVISIONING_KEY)
    assert reply.status == 204
    assert_error(refresh(api, issued["refresh_token"]), 401, "UNAUTHORIZED")
