"""OAuth 2.0 form requests on the token endpoints, through the real handlers on moto:
RFC 6749 (client authentication by HTTP Basic or in the body, the client credentials and
refresh grants, its error codes) and RFC 7009 (revocation). The JSON requests of
api_spec.md are tests/test_auth.py's; tests/test_e2e_oauth.py drives Authlib and
requests-oauthlib over HTTP."""

import base64
import json
import uuid
from urllib.parse import quote, urlencode

import jwt
import pytest

from local.gateway import LambdaContext, api_event, load_handler
from price_keeper.config import get_config
from price_keeper.domain import auth
from tests.conftest import PROVISIONING_KEY, assert_error, cold_handler
from tests.provisioned import ORG_BODY, new_app, new_org, tokens

FORM = "application/x-www-form-urlencoded"
APP_ID = "app-production-api"
CLIENT_CREDENTIALS = {"grant_type": "client_credentials"}
TOKEN_FIELDS = {"access_token", "refresh_token", "token_type", "expires_in", "refresh_expires_in", "scope"}


@pytest.fixture
def client(api) -> dict:
    """An app's credentials, created over the API."""
    org_id, _ = new_org(api)
    return new_app(api, org_id, APP_ID)


def org_of(credentials: dict) -> str:
    return auth.parse_client_id(credentials["client_id"]).org_id


def basic(client_id: str, client_secret: str) -> str:
    """An HTTP Basic header (RFC 7617) as requests and most OAuth2 libraries send it."""
    return "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()


def form(api, path: str, params: dict | str, authorization: str | None = None, **kw):
    headers = {"Content-Type": FORM} | ({"Authorization": authorization} if authorization is not None else {})
    return api.post(path, params if isinstance(params, str) else urlencode(params), headers=headers, **kw)


def token_by_basic(api, credentials: dict, **kw):
    return form(
        api, "/auth/token", CLIENT_CREDENTIALS, basic(credentials["client_id"], credentials["client_secret"]), **kw
    )


def token_by_post(api, credentials: dict, **kw):
    return form(api, "/auth/token", {**CLIENT_CREDENTIALS, **credentials}, **kw)


def token_by_json(api, credentials: dict, **kw):
    return api.post("/auth/token", {**credentials, **CLIENT_CREDENTIALS}, **kw)


def works(api, access_token: str) -> bool:
    """Does a runtime endpoint accept the access token?"""
    claims = jwt.decode(access_token, options={"verify_signature": False})
    path = f"/api/v1/orgs/{claims['org_id']}/apps/{claims['app_id']}/aggregates/today"
    return api.get(path, token=access_token).status == 200


def assert_oauth_error(reply, status: int, code: str) -> dict:
    """The error schema of api_spec.md whose ``error`` is the RFC 6749 §5.2 code, with
    the RFC's ``error_description``."""
    body = assert_error(reply, status, code)
    assert body["error_description"] == body["message"]
    return body


# --- POST /auth/token (RFC 6749 §2.3.1, §4.4) -----------------------------------------------


@pytest.mark.parametrize(
    "request_token", [token_by_basic, token_by_post], ids=["client_secret_basic", "client_secret_post"]
)
def test_a_form_request_gets_the_spec_token_body(api, client, request_token):
    reply = request_token(api, client)
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == TOKEN_FIELDS
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600
    assert body["scope"] == f"org:{org_of(client)} app:{APP_ID}"
    assert reply.headers["content-type"] == "application/json"
    assert (reply.headers["cache-control"], reply.headers["pragma"]) == ("no-store", "no-cache")  # RFC 6749 §5.1
    assert works(api, body["access_token"])


def test_json_token_responses_are_not_cached_either(api, client):
    reply = token_by_json(api, client)
    assert reply.status == 200 and set(reply.json()) == TOKEN_FIELDS
    assert reply.headers["cache-control"] == "no-store"


def test_basic_credentials_may_be_form_urlencoded_as_rfc_6749_says(api, client):
    """§2.3.1 encodes the id and the secret before Basic; most libraries send them as they
    are. A secret is base64 (``+``, ``/``, ``=``, never ``%`` or a space): both work."""
    encoded = basic(quote(client["client_id"], safe=""), quote(client["client_secret"], safe=""))
    reply = form(api, "/auth/token", CLIENT_CREDENTIALS, encoded)
    assert reply.status == 200, reply


def test_the_client_id_may_accompany_basic_credentials_in_the_body(api, client):
    """§3.2.1: a client may name itself with ``client_id`` (requests-oauthlib's
    ``include_client_id=True`` beside an ``auth``); it must be the Basic one."""
    authorization = basic(client["client_id"], client["client_secret"])
    reply = form(api, "/auth/token", {**CLIENT_CREDENTIALS, "client_id": client["client_id"]}, authorization)
    assert reply.status == 200, reply
    other = {**CLIENT_CREDENTIALS, "client_id": f"org-{uuid.uuid4()}"}
    assert_oauth_error(form(api, "/auth/token", other, authorization), 400, "invalid_request")


def test_two_client_authentication_methods_in_one_request_are_400(api, client):
    """§2.3: 'The client MUST NOT use more than one authentication method in each request'."""
    reply = form(
        api, "/auth/token", {**CLIENT_CREDENTIALS, **client}, basic(client["client_id"], client["client_secret"])
    )
    assert_oauth_error(reply, 400, "invalid_request")


@pytest.mark.parametrize(
    "case",
    [
        "basic wrong secret",
        "post wrong secret",
        "unknown client",
        "app secret for org",
        "no client authentication",
        "client_id only",
        "empty secret",
        "bearer scheme",
    ],
)
def test_wrong_or_missing_client_credentials_are_401_invalid_client(api, client, case):
    org_client = f"org-{org_of(client)}"
    wrong = {**client, "client_secret": "d3Jvbmc="}
    reply = {
        "basic wrong secret": lambda: token_by_basic(api, wrong),
        "post wrong secret": lambda: token_by_post(api, wrong),
        "unknown client": lambda: token_by_basic(api, {**client, "client_id": f"org-{uuid.uuid4()}"}),
        "app secret for org": lambda: token_by_post(api, {**client, "client_id": org_client}),
        "no client authentication": lambda: form(api, "/auth/token", CLIENT_CREDENTIALS),
        "client_id only": lambda: form(api, "/auth/token", {**CLIENT_CREDENTIALS, "client_id": client["client_id"]}),
        "empty secret": lambda: token_by_post(api, {**client, "client_secret": ""}),  # §3.2: empty is omitted
        "bearer scheme": lambda: form(api, "/auth/token", CLIENT_CREDENTIALS, "Bearer some-token"),
    }[case]()
    body = assert_oauth_error(reply, 401, "invalid_client")
    assert client["client_secret"] not in json.dumps(body)
    assert reply.headers["www-authenticate"].startswith("Basic realm=")  # §5.2: the scheme the client may use


@pytest.mark.parametrize("grant_type", ["password", "refresh_token", "authorization_code", "CLIENT_CREDENTIALS"])
def test_another_grant_type_is_400_unsupported_grant_type(api, client, grant_type):
    reply = form(api, "/auth/token", {"grant_type": grant_type, **client})
    assert_oauth_error(reply, 400, "unsupported_grant_type")


def test_unrecognized_parameters_are_ignored(api, client):
    """§3.2: 'The authorization server MUST ignore unrecognized request parameters' (a
    requested ``scope`` among them: the reply's ``scope`` says what was granted, §3.3)."""
    reply = form(
        api,
        "/auth/token",
        {**CLIENT_CREDENTIALS, "scope": "read:aggregates", "audience": "x"},
        basic(client["client_id"], client["client_secret"]),
    )
    assert reply.status == 200, reply


MALFORMED_FORMS = {
    "no grant_type": "",
    "empty grant_type": "grant_type=",
    "repeated parameter": "grant_type=client_credentials&grant_type=client_credentials",
    "repeated blank parameter": "grant_type=client_credentials&grant_type=",
    "percent-encoded invalid UTF-8": "grant_type=client_credentials&x=%ff%fe",
    "a JSON body": json.dumps(CLIENT_CREDENTIALS),
    "too many parameters": "&".join(f"p{n}=1" for n in range(1000)) + "&grant_type=client_credentials",
    "separators only": "&&&==&",
}


@pytest.mark.parametrize("body", MALFORMED_FORMS.values(), ids=MALFORMED_FORMS)
def test_malformed_form_bodies_are_400_invalid_request(api, client, body):
    reply = form(api, "/auth/token", body, basic(client["client_id"], client["client_secret"]))
    assert_oauth_error(reply, 400, "invalid_request")


@pytest.mark.parametrize("body, status", [(CLIENT_CREDENTIALS, 200), (b"\xff\xfe", 400)], ids=["form", "not UTF-8"])
def test_a_base64_encoded_form_body_is_read_too(api, client, body, status):
    """What API Gateway sends for a binary media type (isBase64Encoded)."""
    event, function = api_event(
        "POST",
        "/auth/token",
        headers={"Content-Type": FORM, "Authorization": basic(client["client_id"], client["client_secret"])},
    )
    raw = urlencode(body).encode() if isinstance(body, dict) else body
    event.update(body=base64.b64encode(raw).decode(), isBase64Encoded=True)
    response = load_handler(function)(event, LambdaContext(function_name=function))
    assert response["statusCode"] == status, response
    assert ("access_token" if status == 200 else "invalid_request") in response["body"]


def test_a_form_credential_beyond_the_json_length_limit_is_400(api, client):
    reply = token_by_post(api, {**client, "client_secret": "x" * 257})
    assert_oauth_error(reply, 400, "invalid_request")


MALFORMED_BASIC = {
    "scheme only": "Basic",
    "not base64": "Basic !!!!",
    "base64 without a colon": "Basic " + base64.b64encode(b"no-colon").decode(),
    "invalid UTF-8": "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(),
    "non-ASCII header": "Basic \u00e9t\u00e9",
    "percent-encoded invalid UTF-8": "Basic " + base64.b64encode(b"org-%ff:%fe").decode(),
    "empty client id": "Basic " + base64.b64encode(b":secret").decode(),
    "another scheme": "Digest username=x",
    "empty header": "",
}


@pytest.mark.parametrize("authorization", MALFORMED_BASIC.values(), ids=MALFORMED_BASIC)
@pytest.mark.parametrize("path", ["/auth/token", "/auth/refresh", "/auth/revoke"])
def test_malformed_basic_headers_are_4xx_in_the_error_schema(api, path, authorization):
    params = {
        "/auth/token": CLIENT_CREDENTIALS,
        "/auth/refresh": {"grant_type": "refresh_token", "refresh_token": "x"},
        "/auth/revoke": {"token": "x"},
    }[path]
    reply = form(api, path, params, authorization)
    assert 400 <= reply.status < 500, reply
    assert reply.json()["error"] in ("invalid_request", "invalid_client")


def test_other_form_kinds_and_other_routes_still_refuse_form_bodies(api, client):
    multipart = api.post("/auth/token", "x", headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert_error(multipart, 400, "INVALID_REQUEST")
    org_id = org_of(client)
    access = token_by_basic(api, client).json()["access_token"]
    usage = api.post(
        f"/api/v1/orgs/{org_id}/apps/{APP_ID}/usage", "input_tokens=1", headers={"Content-Type": FORM}, token=access
    )
    assert_error(usage, 400, "INVALID_REQUEST")


# --- POST /auth/refresh (RFC 6749 §6) ------------------------------------------------------


def refresh_form(api, credentials: dict, refresh_token: str, **params):
    return form(
        api,
        "/auth/refresh",
        {"grant_type": "refresh_token", "refresh_token": refresh_token, **params},
        basic(credentials["client_id"], credentials["client_secret"]),
    )


def test_refresh_by_form_gives_a_working_access_token(api, client):
    issued = token_by_basic(api, client).json()
    reply = refresh_form(api, client, issued["refresh_token"])
    assert reply.status == 200, reply
    assert set(reply.json()) == {"access_token", "token_type", "expires_in"}
    assert reply.headers["cache-control"] == "no-store"
    assert works(api, reply.json()["access_token"])
    by_post = form(
        api, "/auth/refresh", {"grant_type": "refresh_token", "refresh_token": issued["refresh_token"], **client}
    )
    assert by_post.status == 200, by_post


def test_refresh_by_form_needs_the_clients_own_credentials(api, client):
    """§6: a client issued credentials authenticates when refreshing, and §5.2: a refresh
    token issued to another client is ``invalid_grant``."""
    refresh_token = token_by_basic(api, client).json()["refresh_token"]
    no_auth = form(api, "/auth/refresh", {"grant_type": "refresh_token", "refresh_token": refresh_token})
    assert_oauth_error(no_auth, 401, "invalid_client")
    wrong = refresh_form(api, {**client, "client_secret": "d3Jvbmc="}, refresh_token)
    assert_oauth_error(wrong, 401, "invalid_client")
    org_id = org_of(client)
    sibling = new_app(api, org_id, "sibling")
    assert_oauth_error(refresh_form(api, sibling, refresh_token), 400, "invalid_grant")


@pytest.mark.parametrize("which", ["garbage", "access token", "revoked"])
def test_an_invalid_refresh_token_in_a_form_is_400_invalid_grant(api, client, which):
    issued = token_by_basic(api, client).json()
    if which == "revoked":
        assert form(api, "/auth/revoke", {"token": issued["refresh_token"], **client}).status == 200
    token = {"garbage": "not-a-token", "access token": issued["access_token"], "revoked": issued["refresh_token"]}[
        which
    ]
    assert_oauth_error(refresh_form(api, client, token), 400, "invalid_grant")


@pytest.mark.parametrize(
    "params, code",
    [
        ({"grant_type": "client_credentials"}, "unsupported_grant_type"),
        ({"grant_type": "refresh_token"}, "invalid_request"),
        ({"refresh_token": "x"}, "invalid_request"),
    ],
)
def test_malformed_refresh_forms_are_400(api, client, params, code):
    reply = form(api, "/auth/refresh", params, basic(client["client_id"], client["client_secret"]))
    assert_oauth_error(reply, 400, code)


# --- POST /auth/revoke (RFC 7009) ---------------------------------------------------------


def revoke_form(api, credentials: dict, token: str, **params):
    return form(
        api, "/auth/revoke", {"token": token, **params}, basic(credentials["client_id"], credentials["client_secret"])
    )


def test_revocation_by_form_counts_on_the_orgs_own_limit_as_by_json(limits_on, api):
    """``auth_revoke`` is one of the limits an org sets for its clients (docs/api.md): a
    form request spends it as a JSON one does (red-team: forms had config.yaml's 10)."""
    from tests.provisioned import put_org

    org_id = str(uuid.uuid4())
    body = {**ORG_BODY, "overrides": {**ORG_BODY["overrides"], "rate_limits": {"auth_revoke": 2}}}
    assert put_org(api, org_id, body).status == 201
    credentials = new_app(api, org_id, APP_ID)
    issued = tokens(api, credentials)
    statuses = [revoke_form(api, credentials, issued["refresh_token"]).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    fresh = tokens(api, credentials)  # (the revoked refresh token took its access token with it)
    json_revoke = api.post("/auth/revoke", {"token": fresh["refresh_token"]}, token=fresh["access_token"])
    assert_error(json_revoke, 429, "RATE_LIMIT_EXCEEDED")


def test_revoking_a_refresh_token_by_form_is_200_and_ends_it(api, client):
    issued = token_by_basic(api, client).json()
    reply = revoke_form(api, client, issued["refresh_token"], token_type_hint="refresh_token")
    assert reply.status == 200, reply
    assert reply.json() == {}
    assert_oauth_error(refresh_form(api, client, issued["refresh_token"]), 400, "invalid_grant")
    assert not works(api, issued["access_token"])  # issued from the revoked refresh token


def test_revoking_an_access_token_by_form_with_client_secret_post(api, client):
    issued = token_by_basic(api, client).json()
    reply = form(api, "/auth/revoke", {"token": issued["access_token"], "token_type_hint": "access_token", **client})
    assert reply.status == 200, reply
    assert not works(api, issued["access_token"])


@pytest.mark.parametrize("token", ["not-a-token", "eyJhbGciOiJIUzI1NiJ9.e30.c2ln", "x" * 4096])
def test_revoking_an_invalid_token_by_form_is_200(api, client, token):
    """RFC 7009 §2.2: 'invalid tokens do not cause an error response'."""
    assert revoke_form(api, client, token).status == 200


def test_revoking_another_clients_token_by_form_is_400_and_keeps_it(api, client):
    org_id = org_of(client)
    other = new_app(api, org_id, "other-app")
    issued = token_by_basic(api, other).json()
    assert_oauth_error(revoke_form(api, client, issued["refresh_token"]), 400, "invalid_grant")
    assert refresh_form(api, other, issued["refresh_token"]).status == 200


@pytest.mark.parametrize(
    "params, code",
    [
        ({"token_type_hint": "refresh_token"}, "invalid_request"),
        ({"token": "x", "token_type_hint": "id_token"}, "unsupported_token_type"),
        ("token=x&token=y", "invalid_request"),
    ],
)
def test_malformed_revoke_forms_are_400(api, client, params, code):
    reply = form(api, "/auth/revoke", params, basic(client["client_id"], client["client_secret"]))
    assert_oauth_error(reply, 400, code)


def test_revoke_by_form_authenticates_the_client_not_a_bearer(api, client):
    issued = token_by_basic(api, client).json()
    reply = form(api, "/auth/revoke", {"token": issued["refresh_token"]}, f"Bearer {issued['access_token']}")
    assert_oauth_error(reply, 401, "invalid_client")
    assert refresh_form(api, client, issued["refresh_token"]).status == 200


def test_json_revocation_is_unchanged(api, client):
    issued = tokens(api, client)
    reply = api.post("/auth/revoke", {"token": issued["refresh_token"]}, token=issued["access_token"])
    assert reply.status == 204 and reply.text == ""


# --- rate limits and failed attempts: the same for forms as for JSON ---------------------------


def test_failed_form_attempts_count_with_json_ones_per_client_and_address(limits_on, api, client):
    wrong = {**client, "client_secret": "d3Jvbmc="}
    elsewhere = "203.0.113.9"
    for attempt in range(10):
        send = (token_by_basic, token_by_post, token_by_json)[attempt % 3]
        assert send(api, wrong, source_ip=elsewhere).status == 401
    limited = token_by_basic(api, wrong, source_ip=elsewhere)
    assert_error(limited, 429, "RATE_LIMIT_EXCEEDED")
    assert limited.headers["retry-after"]
    assert token_by_basic(api, client).status == 200  # the real client, from its own address


def test_right_secrets_in_forms_are_not_failed_attempts(limits_on, api, client):
    for _ in range(get_config().rate_limits[auth.CLIENT_LIMIT].requests):
        assert token_by_post(api, client).status == 200
    wrong = {**client, "client_secret": "d3Jvbmc="}
    limit = get_config().rate_limits[auth.FAILED_ATTEMPTS_LIMIT].requests
    assert [token_by_post(api, wrong).status for _ in range(limit)] == [401] * limit  # none of them was spent
    assert_error(token_by_post(api, wrong), 429, "RATE_LIMIT_EXCEEDED")


def test_client_authentication_on_refresh_and_revoke_forms_counts_as_an_attempt(limits_on, api, client):
    """Every bcrypt check is limited alike: wrong secrets sent to /auth/refresh or
    /auth/revoke count against the token endpoint's failed-attempt limit."""
    wrong = {**client, "client_secret": "d3Jvbmc="}
    elsewhere = "203.0.113.10"
    for attempt in range(10):
        path = ("/auth/refresh", "/auth/revoke")[attempt % 2]
        params = {"grant_type": "refresh_token", "refresh_token": "x"} if path == "/auth/refresh" else {"token": "x"}
        reply = form(api, path, params, basic(wrong["client_id"], wrong["client_secret"]), source_ip=elsewhere)
        assert reply.status == 401, reply
    assert_error(token_by_basic(api, wrong, source_ip=elsewhere), 429, "RATE_LIMIT_EXCEEDED")


def test_form_revocations_count_against_the_revoke_limit(limits_on, api, client):
    limit = get_config().rate_limits["auth_revoke"].requests
    statuses = [revoke_form(api, client, "not-a-token").status for _ in range(limit + 1)]
    assert statuses == [200] * limit + [429]


# --- secrets never reach the logs ---------------------------------------------------------------


def test_form_secrets_never_reach_the_logs_even_with_event_logging_switched_on(api, monkeypatch, capfd, caplog):
    monkeypatch.setenv("POWERTOOLS_DEV", "true")
    monkeypatch.setenv("POWERTOOLS_LOGGER_LOG_EVENT", "true")
    handlers = {name: cold_handler(name) for name in ("put_org", "auth_token", "auth_refresh", "auth_revoke")}

    def call(method: str, path: str, body: str, headers: dict) -> dict:
        event, function = api_event(method, path, body=body, headers=headers)
        response = handlers[function](event, LambdaContext(function_name=function))
        return json.loads(response["body"]) if response["body"] else {}

    org_id = str(uuid.uuid4())
    created = call(
        "PUT",
        f"/api/v1/orgs/{org_id}",
        json.dumps(ORG_BODY),
        {"X-API-Key": PROVISIONING_KEY, "Content-Type": "application/json"},
    )["credentials"]
    authorization = basic(created["client_id"], created["client_secret"])
    by_basic = call(
        "POST", "/auth/token", urlencode(CLIENT_CREDENTIALS), {"Content-Type": FORM, "Authorization": authorization}
    )
    by_post = call("POST", "/auth/token", urlencode({**CLIENT_CREDENTIALS, **created}), {"Content-Type": FORM})
    refused = call(
        "POST",
        "/auth/token",
        urlencode({**CLIENT_CREDENTIALS, **created, "client_secret": "wrong"}),
        {"Content-Type": FORM},
    )
    mixed = call(
        "POST",
        "/auth/token",
        urlencode({**CLIENT_CREDENTIALS, **created}),
        {"Content-Type": FORM, "Authorization": authorization},
    )
    refreshed = call(
        "POST",
        "/auth/refresh",
        urlencode({"grant_type": "refresh_token", "refresh_token": by_basic["refresh_token"]}),
        {"Content-Type": FORM, "Authorization": authorization},
    )
    call(
        "POST",
        "/auth/revoke",
        urlencode({"token": by_post["refresh_token"]}),
        {"Content-Type": FORM, "Authorization": authorization},
    )
    assert "access_token" in by_post and "access_token" in refreshed
    assert (refused["error"], mixed["error"]) == ("invalid_client", "invalid_request")
    logged = capfd.readouterr()
    records = json.dumps([vars(record) for record in caplog.records], default=str)
    for secret in (
        created["client_secret"],
        authorization.split()[1],
        quote(created["client_secret"], safe=""),
        by_basic["refresh_token"],
        by_post["refresh_token"],
    ):
        assert secret not in logged.out + logged.err + records


# --- the OpenAPI document declares the form bodies ------------------------------------------------


def test_openapi_declares_the_form_bodies_and_basic_client_authentication(api):
    document = api.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert document["components"]["securitySchemes"]["clientBasic"] == {"type": "http", "scheme": "basic"}
    expected = {
        "/auth/token": {"grant_type"},
        "/auth/refresh": {"grant_type", "refresh_token"},
        "/auth/revoke": {"token"},
    }
    for path, required in expected.items():
        operation = document["paths"][path]["post"]
        content = operation["requestBody"]["content"]
        assert "application/json" in content
        form_schema = schemas[content[FORM]["schema"]["$ref"].rsplit("/", 1)[1]]
        assert set(form_schema["required"]) == required
        assert {"client_id", "client_secret"} <= set(form_schema["properties"])
        assert {"clientBasic": []} in operation["security"]
    revoke = document["paths"]["/auth/revoke"]["post"]
    assert {"bearerAuth": []} in revoke["security"]
    assert {"200", "204"} <= set(revoke["responses"])
