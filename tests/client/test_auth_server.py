"""Login, token caching, refresh before expiry, re-login, and revocation on close — against
the real local server over HTTP."""

from __future__ import annotations

import pytest
import requests

from price_keeper_client import PriceKeeper, Unauthorized
from price_keeper_client.auth import Principal

from .conftest import CallLog, FakeClock, provision

pytestmark = pytest.mark.e2e


@pytest.fixture
def app_client(server):
    org_id, creds = provision(server)
    session = requests.Session()
    calls = CallLog(session)
    clock = FakeClock()
    keeper = PriceKeeper(server.url, creds.client_id, creds.client_secret, session=session, clock=clock)
    yield keeper, calls, clock, org_id
    keeper.transport.close()


def test_client_id_names_org_and_app():
    org = "550e8400-e29b-41d4-a716-446655440000"
    assert Principal.from_client_id(f"org-{org}") == Principal(org)
    assert Principal.from_client_id(f"org-{org}-app-app-production-api") == Principal(org, "app-production-api")
    with pytest.raises(ValueError):
        Principal.from_client_id(f"org-{org}-xyz")


def test_token_is_cached_and_refreshed_five_minutes_before_expiry(app_client):
    keeper, calls, clock, _ = app_client
    first = keeper.tokens.access_token()
    assert keeper.tokens.access_token() == first
    clock.advance(3600 - 301)
    keeper.tokens.access_token()
    assert (calls.count("POST", "/auth/token"), calls.count("POST", "/auth/refresh")) == (1, 0)
    clock.advance(2)  # now inside the 5-minute margin
    refreshed = keeper.tokens.access_token()
    assert (calls.count("POST", "/auth/token"), calls.count("POST", "/auth/refresh")) == (1, 1)
    # the refreshed token is accepted by the service: it can revoke with it
    keeper.tokens.revoke(refreshed, "access_token")


def test_refused_refresh_token_falls_back_to_login(app_client, server):
    keeper, calls, clock, _ = app_client
    access = keeper.tokens.access_token()
    refresh = keeper.tokens._tokens.refresh_token
    # someone revokes the refresh token behind the client's back
    requests.post(
        f"{server.url}/auth/revoke",
        json={"token": refresh, "token_type_hint": "refresh_token"},
        headers={"Authorization": f"Bearer {access}"},
        timeout=10,
    ).raise_for_status()
    clock.advance(3600 - 60)
    keeper.tokens.access_token()
    assert calls.count("POST", "/auth/refresh") == 1
    assert calls.count("POST", "/auth/token") == 2


def test_close_revokes_the_refresh_token_and_its_access_tokens(app_client, server):
    keeper, _, _, _ = app_client
    access = keeper.tokens.access_token()
    refresh = keeper.tokens._tokens.refresh_token
    assert keeper.close()
    reply = requests.post(
        f"{server.url}/auth/refresh", json={"refresh_token": refresh, "grant_type": "refresh_token"}, timeout=10
    )
    assert reply.status_code == 401 and reply.json()["error"] == "UNAUTHORIZED"
    reply = requests.post(
        f"{server.url}/auth/revoke", json={"token": refresh}, headers={"Authorization": f"Bearer {access}"}, timeout=10
    )
    assert reply.status_code == 401


def test_wrong_secret_is_unauthorized(server):
    _, creds = provision(server)
    keeper = PriceKeeper(server.url, creds.client_id, "not-the-secret")
    with pytest.raises(Unauthorized) as caught:
        keeper.tokens.access_token()
    assert caught.value.status == 401 and caught.value.message
