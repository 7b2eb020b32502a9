"""``Provisioning``: the admin API (``X-API-Key``) for orgs, apps, credential rotation,
revoking a client's tokens, and the reconciliation with Bedrock's own counts."""

from __future__ import annotations

import os
from typing import Any

import requests

from .models import Provisioned, Rotation
from .transport import DEFAULT_URL, Transport

API = "/api/v1"


class Provisioning:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        session: requests.Session | None = None,
        timeout: float = 30.0,
    ):
        if not api_key:
            raise ValueError("a provisioning API key is required")
        self.transport = Transport(url, session=session, timeout=timeout)
        self._headers = {"X-API-Key": api_key}

    def __repr__(self) -> str:
        return f"Provisioning(url={self.transport.base_url!r})"

    @classmethod
    def from_env(cls, **kwargs: Any) -> Provisioning:
        """Reads ``PRICE_KEEPER_URL`` and ``PRICE_KEEPER_API_KEY``."""
        api_key = os.environ.get("PRICE_KEEPER_API_KEY")
        if not api_key:
            raise ValueError("set PRICE_KEEPER_API_KEY to the provisioning API key")
        return cls(os.environ.get("PRICE_KEEPER_URL") or DEFAULT_URL, api_key, **kwargs)

    def put_org(self, org_id: str, config: dict) -> Provisioned:
        """Creates (201, with one-time credentials) or updates (200) an org."""
        return Provisioned.from_json(
            self.transport.request("PUT", f"{API}/orgs/{org_id}", json=config, headers=self._headers).body
        )

    def put_app(self, org_id: str, app_id: str, config: dict) -> Provisioned:
        """Creates (201, with one-time credentials) or updates (200) an app."""
        return Provisioned.from_json(
            self.transport.request("PUT", f"{API}/orgs/{org_id}/apps/{app_id}", json=config, headers=self._headers).body
        )

    def rotate(self, org_id: str, app_id: str | None = None, *, grace_period_hours: int = 168) -> Rotation:
        """A new client secret; the old one keeps working for ``grace_period_hours`` (0-168)."""
        path = f"{API}/orgs/{org_id}" + (f"/apps/{app_id}" if app_id else "") + "/credentials/rotate"
        body = self.transport.request(
            "POST", path, json={"grace_period_hours": grace_period_hours}, headers=self._headers
        ).body
        return Rotation.from_json(body)

    def revoke_tokens(self, org_id: str, app_id: str | None = None) -> None:
        """Ends every token issued to the org's (or app's) client before now: refresh tokens
        at once, access tokens within 30 s. The client secret keeps working."""
        path = f"{API}/orgs/{org_id}" + (f"/apps/{app_id}" if app_id else "") + "/credentials/revoke-tokens"
        self.transport.request("POST", path, json={}, headers=self._headers)

    def reconciliation(self, day: str | None = None) -> dict:
        """Bedrock's own counts against the metered ones per model for a UTC day (default
        today): ``{"date", "region", "models": [{"model_id", "bedrock", "metered", "unmetered"}],
        "page", "pages"}``, every page's models read and joined."""
        params = {"date": day} if day else {}
        first = self.transport.request("GET", f"{API}/reconciliation", params=params, headers=self._headers).body
        models = list(first["models"])
        for page in range(1, first["pages"]):
            more = self.transport.request(
                "GET", f"{API}/reconciliation", params={**params, "page": str(page)}, headers=self._headers
            ).body
            models += more["models"]
        return {**first, "models": models}

    def close(self) -> None:
        self.transport.close()
