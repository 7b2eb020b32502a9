"""One way to set up a tenant over HTTP, the way users provision: an org and its apps
created with the client library's admin API (``price_keeper_client.Provisioning``), and
their client-credentials tokens from ``POST /auth/token``.

A plain module (no pytest, no test fixtures) so that the benchmarks set up their tenants
exactly as the end-to-end tests do. The in-process handler tests use ``tests/provisioned.py``."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from price_keeper_client import Provisioning
from price_keeper_client.transport import Transport

ORG = {
    "org_name": "tenant",
    "timezone": "UTC",
    "quota_scope": "APP",
    "model_ordering": ["premium", "standard", "economy"],
    "quotas": {"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000},
}


@dataclass(frozen=True)
class Tenant:
    """An org created over HTTP and its apps; ``credentials`` holds each client's one-time
    ``client_id`` and ``client_secret`` by app id (``None``: the org's own client)."""

    base_url: str
    org_id: str
    credentials: dict[str | None, dict]

    @property
    def org_path(self) -> str:
        """The org's URL (``{base_url}/api/v1/orgs/{org_id}``)."""
        return f"{self.base_url}/api/v1/orgs/{self.org_id}"

    def app_path(self, app_id: str) -> str:
        return f"{self.org_path}/apps/{app_id}"

    def tokens(self, app_id: str | None = None) -> dict:
        """The token reply (access and refresh token) of the app's client, or the org's."""
        return tokens(self.base_url, self.credentials[app_id])

    def bearer(self, app_id: str | None = None) -> dict[str, str]:
        """An ``Authorization`` header with a fresh access token of the app, or the org."""
        return bearer(self.base_url, self.credentials[app_id])


def new_tenant(
    base_url: str, api_key: str, apps: Mapping[str, dict] | Iterable[str] = ("web",), **org_fields
) -> Tenant:
    """A new org (``ORG`` with ``org_fields``) and its ``apps``: app ids, or app id → the
    app's configuration (``app_name`` defaults to the id). Both must be created (201)."""
    org_id = str(uuid.uuid4())
    configs = dict(apps) if isinstance(apps, Mapping) else {app_id: {} for app_id in apps}
    admin = Provisioning(base_url, api_key)
    try:
        provisioned = {None: admin.put_org(org_id, {**ORG, **org_fields})}
        for app_id, config in configs.items():
            provisioned[app_id] = admin.put_app(org_id, app_id, {"app_name": app_id, **config})
    finally:
        admin.close()
    for who, reply in provisioned.items():
        assert reply.created, f"{who or 'the org'} was not created: {reply.raw}"
    return Tenant(base_url, org_id, {who: dataclasses.asdict(reply.credentials) for who, reply in provisioned.items()})


def tokens(base_url: str, credentials: dict) -> dict:
    """``POST /auth/token`` with the client credentials grant (a refusal raises the client's error)."""
    transport = Transport(base_url)
    try:
        grant = {**credentials, "grant_type": "client_credentials"}
        return transport.request("POST", "/auth/token", json=grant).body
    finally:
        transport.close()


def bearer(base_url: str, credentials: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens(base_url, credentials)['access_token']}"}
