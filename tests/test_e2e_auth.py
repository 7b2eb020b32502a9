"""End to end over real HTTP: the local server (``python -m local``) in a subprocess,
provisioning, tokens, refresh, revocation, revoke-tokens and rotation, token limits per source
address, and state that survives a restart."""

from __future__ import annotations

import http.client
import json
import time
import uuid
from urllib.parse import urlparse

import pytest
import requests

from tests.local_server import local_server

KEY = "e2e-provisioning-key"

pytestmark = pytest.mark.e2e


ORG_BODY = {
    "org_name": "e2e corp",
    "timezone": "Europe/Berlin",
    "quota_scope": "APP",
    "model_ordering": ["premium", "standard"],
    "quotas": {"premium": 10_000_000, "standard": 5_000_000},
}


def provision_org(base_url: str, org_id: str) -> dict:
    reply = requests.put(f"{base_url}/api/v1/orgs/{org_id}", headers={"X-API-Key": KEY}, json=ORG_BODY, timeout=10)
    assert reply.status_code == 201, reply.text
    return reply.json()["credentials"]


def get_tokens(base_url: str, credentials: dict) -> requests.Response:
    return requests.post(f"{base_url}/auth/token", json={**credentials, "grant_type": "client_credentials"}, timeout=10)


def refresh(base_url: str, refresh_token: str) -> requests.Response:
    return requests.post(
        f"{base_url}/auth/refresh", json={"refresh_token": refresh_token, "grant_type": "refresh_token"}, timeout=10
    )


def revoke(base_url: str, token: str, bearer: str) -> requests.Response:
    return requests.post(
        f"{base_url}/auth/revoke", json={"token": token}, headers={"Authorization": f"Bearer {bearer}"}, timeout=10
    )


def test_provision_authenticate_refresh_revoke_rotate_over_http(tmp_path):
    with local_server(tmp_path, KEY) as base_url:
        org_id = str(uuid.uuid4())
        unauthenticated = requests.put(f"{base_url}/api/v1/orgs/{org_id}", json=ORG_BODY, timeout=10)
        assert unauthenticated.status_code == 401
        provision_org(base_url, org_id)
        app = requests.put(
            f"{base_url}/api/v1/orgs/{org_id}/apps/web-app",
            headers={"X-API-Key": KEY},
            json={"app_name": "Web app", "model_ordering": ["standard"]},
            timeout=10,
        )
        assert app.status_code == 201, app.text
        credentials = app.json()["credentials"]
        assert credentials["client_id"] == f"org-{org_id}-app-web-app"
        # Credentials are checked before the body is read: a bad body never turns a missing
        # key or token into a 400 that would tell a caller which bodies are accepted.
        usage = f"{base_url}/api/v1/orgs/{org_id}/apps/web-app/usage"
        for body in ("not json", "[]", '{"request_id": 1}'):
            headers = {"Content-Type": "application/json"}
            for url, method in ((usage, "POST"), (f"{base_url}/api/v1/orgs/{org_id}", "PUT")):
                refused = requests.request(method, url, data=body, headers=headers, timeout=10)
                assert refused.status_code == 401 and refused.json()["error"] == "UNAUTHORIZED", (method, body)

        issued = get_tokens(base_url, credentials)
        assert issued.status_code == 200, issued.text
        issued = issued.json()
        refreshed = refresh(base_url, issued["refresh_token"])
        assert refreshed.status_code == 200, refreshed.text
        refreshed_access = refreshed.json()["access_token"]

        revoked = revoke(base_url, issued["refresh_token"], bearer=issued["access_token"])
        assert revoked.status_code == 204 and revoked.content == b""
        assert refresh(base_url, issued["refresh_token"]).status_code == 401
        # The access tokens issued from the revoked refresh token no longer authenticate.
        for access in (issued["access_token"], refreshed_access):
            reply = revoke(base_url, issued["refresh_token"], bearer=access)
            assert reply.status_code == 401 and reply.json()["error"] == "UNAUTHORIZED"

        rotated = requests.post(
            f"{base_url}/api/v1/orgs/{org_id}/apps/web-app/credentials/rotate",
            headers={"X-API-Key": KEY},
            json={"grace_period_hours": 0},
            timeout=10,
        )
        assert rotated.status_code == 200, rotated.text
        assert get_tokens(base_url, credentials).status_code == 401
        new_credentials = {**credentials, "client_secret": rotated.json()["client_secret"]}
        assert get_tokens(base_url, new_credentials).status_code == 200


def test_orgs_secrets_and_signing_key_survive_a_restart(tmp_path):
    state_dir = tmp_path / "state"
    org_id = str(uuid.uuid4())
    with local_server(tmp_path, KEY, LOCAL_PERSIST="on", LOCAL_STATE_DIR=str(state_dir)) as base_url:
        credentials = provision_org(base_url, org_id)
        first_session = get_tokens(base_url, credentials).json()
    assert (state_dir / "moto-journal.jsonl").exists()
    with local_server(tmp_path, KEY, LOCAL_PERSIST="on", LOCAL_STATE_DIR=str(state_dir)) as base_url:
        assert get_tokens(base_url, credentials).status_code == 200
        assert refresh(base_url, first_session["refresh_token"]).status_code == 200
        again = requests.put(f"{base_url}/api/v1/orgs/{org_id}", headers={"X-API-Key": KEY}, json=ORG_BODY, timeout=10)
        assert again.status_code == 200, again.text  # an update: the org is still there


def post_from(base_url: str, source_ip: str, path: str, body: dict) -> tuple[int, dict]:
    """POST over a connection whose source address is ``source_ip`` (any 127.x is loopback)."""
    url = urlparse(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10, source_address=(source_ip, 0))
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        connection.close()


def test_wrong_secrets_from_another_address_do_not_lock_out_the_client_and_revoke_tokens(tmp_path):
    """Rate limits on. Ten wrong secrets sent with the real client id from 127.0.0.2 are
    limited there, and the real client on 127.0.0.1 still gets its token; then the admin
    ends every token of the client over HTTP."""
    with local_server(tmp_path, KEY, RATE_LIMITS="on") as base_url:
        org_id = str(uuid.uuid4())
        credentials = provision_org(base_url, org_id)
        wrong = {**credentials, "client_secret": "wrong", "grant_type": "client_credentials"}
        statuses = [post_from(base_url, "127.0.0.2", "/auth/token", wrong)[0] for _ in range(10)]
        assert statuses == [401] * 10
        status, body = post_from(base_url, "127.0.0.2", "/auth/token", wrong)
        assert (status, body["error"]) == (429, "RATE_LIMIT_EXCEEDED")

        status, issued = post_from(
            base_url, "127.0.0.1", "/auth/token", {**credentials, "grant_type": "client_credentials"}
        )
        assert status == 200, issued
        revoked = requests.post(
            f"{base_url}/api/v1/orgs/{org_id}/credentials/revoke-tokens",
            headers={"X-API-Key": KEY},
            json={},
            timeout=10,
        )
        assert revoked.status_code == 204, revoked.text
        assert refresh(base_url, issued["refresh_token"]).status_code == 401
        again = get_tokens(base_url, credentials)
        assert again.status_code == 200, again.text
        assert refresh(base_url, again.json()["refresh_token"]).status_code == 200


def test_requests_naming_apps_the_org_does_not_have_count_against_the_clients_limit_over_http(tmp_path):
    """Rate limits on, the org's selection limit set to 3 a minute. Its token, naming app
    ids the org does not have, gets 404s, and past the limit 429s, and then 429 on its real
    app too: a client cannot make the service read config without end by naming made-up
    apps (a red team found those 404s uncounted)."""
    from tests.tenants import new_tenant

    with local_server(tmp_path, KEY, RATE_LIMITS="on") as base_url:
        tenant = new_tenant(base_url, KEY, ["app-1"], overrides={"rate_limits": {"model_selection": 3}})
        bearer = tenant.bearer()
        if time.time() % 60 > 45:  # the limit counts per minute: start with 15 s to go, at least
            time.sleep(60.5 - time.time() % 60)
        ghosts = [
            requests.get(f"{tenant.app_path(f'ghost-{n}')}/model-selection", headers=bearer, timeout=10)
            for n in range(4)
        ]
        assert [(r.status_code, r.json()["error"]) for r in ghosts] == [(404, "NOT_FOUND")] * 3 + [
            (429, "RATE_LIMIT_EXCEEDED")
        ]
        real = requests.get(f"{tenant.app_path('app-1')}/model-selection", headers=bearer, timeout=10)
        assert real.status_code == 429, real.text
