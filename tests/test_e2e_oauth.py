"""Standard OAuth2 client libraries against the local server over HTTP: Authlib
(``client_secret_basic`` and ``client_secret_post``) and requests-oauthlib's
BackendApplicationClient (client id in the body or not) get tokens that work, refresh them
at /auth/refresh, and Authlib's ``revoke_token`` revokes a refresh token (RFC 7009)."""

from __future__ import annotations

import time

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session as AuthlibSession
from authlib.integrations.requests_client import OAuthError
from oauthlib.oauth2 import BackendApplicationClient, InvalidClientError, InvalidGrantError
from requests.auth import HTTPBasicAuth
from requests_oauthlib import OAuth2Session

from tests.local_server import local_server
from tests.tenants import new_tenant

KEY = "e2e-oauth-provisioning-key"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # The local server speaks plain HTTP on the loopback; both libraries insist on HTTPS otherwise.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OAUTHLIB_INSECURE_TRANSPORT", "1")
        patch.setenv("AUTHLIB_INSECURE_TRANSPORT", "1")
        with local_server(tmp_path_factory.mktemp("oauth"), KEY) as url:
            yield url


@pytest.fixture
def org(base_url) -> tuple[str, dict]:
    """(org_id, credentials) of an org provisioned over HTTP."""
    tenant = new_tenant(base_url, KEY, apps=())
    return tenant.org_id, tenant.credentials[None]


def works(base_url: str, org_id: str, access_token: str) -> bool:
    reply = requests.get(
        f"{base_url}/api/v1/orgs/{org_id}/aggregates/today",
        headers={"Authorization": f"Bearer {access_token}"},
        timeout=10,
    )
    return reply.status_code == 200


def authlib_session(credentials: dict, method: str) -> AuthlibSession:
    return AuthlibSession(
        credentials["client_id"],
        credentials["client_secret"],
        token_endpoint_auth_method=method,
        revocation_endpoint_auth_method=method,
    )


def authlib_basic(url: str, credentials: dict) -> dict:
    return authlib_session(credentials, "client_secret_basic").fetch_token(url, grant_type="client_credentials")


def authlib_post(url: str, credentials: dict) -> dict:
    return authlib_session(credentials, "client_secret_post").fetch_token(url, grant_type="client_credentials")


def oauthlib_without_client_id_in_body(url: str, credentials: dict) -> dict:
    """The requests-oauthlib documentation's backend flow: HTTP Basic, no client id in the body."""
    session = OAuth2Session(client=BackendApplicationClient(client_id=credentials["client_id"]))
    return session.fetch_token(url, client_secret=credentials["client_secret"])


def oauthlib_with_client_id_in_body(url: str, credentials: dict) -> dict:
    """``include_client_id=True``: client id and secret in the body (client_secret_post)."""
    session = OAuth2Session(client=BackendApplicationClient(client_id=credentials["client_id"]))
    return session.fetch_token(url, client_secret=credentials["client_secret"], include_client_id=True)


FLOWS = {
    "authlib client_secret_basic": authlib_basic,
    "authlib client_secret_post": authlib_post,
    "requests-oauthlib without client_id in body": oauthlib_without_client_id_in_body,
    "requests-oauthlib with client_id in body": oauthlib_with_client_id_in_body,
}


def test_every_library_flow_gets_a_token_that_works(base_url, org):
    org_id, credentials = org
    working = []
    for name, fetch in FLOWS.items():
        token = fetch(f"{base_url}/auth/token", credentials)
        assert token["token_type"] == "Bearer" and token["expires_in"] == 3600, name
        if works(base_url, org_id, token["access_token"]):
            working.append(name)
    assert working == list(FLOWS), f"{len(working)} of {len(FLOWS)} OAuth2 library flows got a working token"


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
def test_authlib_refreshes_and_revokes_a_refresh_token(base_url, org, method):
    org_id, credentials = org
    session = authlib_session(credentials, method)
    first = session.fetch_token(f"{base_url}/auth/token", grant_type="client_credentials")
    refreshed = session.refresh_token(f"{base_url}/auth/refresh")
    assert refreshed["access_token"] != first["access_token"]
    assert refreshed["refresh_token"] == first["refresh_token"]  # kept: /auth/refresh returns none
    assert works(base_url, org_id, refreshed["access_token"])

    revoked = session.revoke_token(
        f"{base_url}/auth/revoke", token=first["refresh_token"], token_type_hint="refresh_token"
    )
    assert revoked.status_code == 200, revoked.text
    with pytest.raises(OAuthError) as refused:
        session.refresh_token(f"{base_url}/auth/refresh", refresh_token=first["refresh_token"])
    assert refused.value.error == "invalid_grant"
    assert not works(base_url, org_id, refreshed["access_token"])  # issued from the revoked refresh token


def test_authlib_refreshes_an_expired_access_token_by_itself_at_its_token_endpoint(base_url, org):
    """Authlib renews an expired token at its ``token_endpoint`` before a request: naming
    /auth/refresh there (docs/auth.md) keeps a long-lived session working."""
    org_id, credentials = org
    session = AuthlibSession(
        credentials["client_id"], credentials["client_secret"], token_endpoint=f"{base_url}/auth/refresh"
    )
    first = session.fetch_token(f"{base_url}/auth/token", grant_type="client_credentials")
    session.token["expires_at"] = int(time.time()) - 1
    reply = session.get(f"{base_url}/api/v1/orgs/{org_id}/aggregates/today", timeout=10)
    assert reply.status_code == 200, reply.text
    assert session.token["access_token"] != first["access_token"]


def test_requests_oauthlib_refreshes_with_basic_client_authentication(base_url, org):
    org_id, credentials = org
    session = OAuth2Session(client=BackendApplicationClient(client_id=credentials["client_id"]))
    first = session.fetch_token(f"{base_url}/auth/token", client_secret=credentials["client_secret"])
    refreshed = session.refresh_token(
        f"{base_url}/auth/refresh", auth=HTTPBasicAuth(credentials["client_id"], credentials["client_secret"])
    )
    assert refreshed["access_token"] != first["access_token"]
    assert works(base_url, org_id, refreshed["access_token"])


def test_libraries_read_the_rfc_6749_error_codes(base_url, org):
    _, credentials = org
    wrong = {**credentials, "client_secret": "d3Jvbmc="}
    with pytest.raises(OAuthError) as authlib_refusal:
        authlib_basic(f"{base_url}/auth/token", wrong)
    assert authlib_refusal.value.error == "invalid_client"
    with pytest.raises(InvalidClientError):
        oauthlib_with_client_id_in_body(f"{base_url}/auth/token", wrong)
    session = OAuth2Session(client=BackendApplicationClient(client_id=credentials["client_id"]))
    with pytest.raises(InvalidGrantError):
        session.refresh_token(
            f"{base_url}/auth/refresh",
            refresh_token="not-a-token",
            auth=HTTPBasicAuth(credentials["client_id"], credentials["client_secret"]),
        )
