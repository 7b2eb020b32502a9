"""Client-credentials login with a cached token pair.

The access token is refreshed a few minutes before it expires (``POST /auth/refresh``);
when the refresh token itself is refused (revoked, expired, the secret was rotated) the
manager logs in again with the client secret. ``close()`` revokes the refresh token, which
also ends every access token issued from it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import PriceKeeperError, Unauthorized
from .transport import Transport

log = logging.getLogger("price_keeper_client")

REFRESH_MARGIN_SECS = 300


@dataclass(frozen=True)
class Principal:
    """Who a client id names: ``org-{org_id}`` or ``org-{org_id}-app-{app_id}``."""

    org_id: str
    app_id: str | None = None

    @classmethod
    def from_client_id(cls, client_id: str) -> Principal:
        # An org id is a 36-character UUID, so the app part (if any) starts at a fixed place.
        if not client_id.startswith("org-") or len(client_id) < 40:
            raise ValueError("client_id must look like org-<org_id> or org-<org_id>-app-<app_id>")
        org_id, rest = client_id[4:40], client_id[40:]
        if not rest:
            return cls(org_id)
        if not rest.startswith("-app-") or len(rest) == 5:
            raise ValueError("client_id must look like org-<org_id> or org-<org_id>-app-<app_id>")
        return cls(org_id, rest[5:])


@dataclass
class _Tokens:
    access_token: str = field(repr=False)
    refresh_token: str = field(repr=False)
    access_expires_at: float
    refresh_expires_at: float
    margin: float  # refresh this long before expiry


class TokenManager:
    """Hands out a valid access token, logging in or refreshing as needed (thread-safe)."""

    def __init__(
        self,
        transport: Transport,
        client_id: str,
        client_secret: str,
        *,
        refresh_margin: float = REFRESH_MARGIN_SECS,
        clock: Callable[[], float] = time.time,
    ):
        self.transport = transport
        self.client_id = client_id
        self._client_secret = client_secret
        self.refresh_margin = refresh_margin
        self.clock = clock
        self._tokens: _Tokens | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"TokenManager(client_id={self.client_id!r})"

    def authorization(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token()}"}

    def access_token(self) -> str:
        with self._lock:
            now = self.clock()
            if self._tokens is None or now >= self._tokens.refresh_expires_at - self._tokens.margin:
                self._login()
            elif now >= self._tokens.access_expires_at - self._tokens.margin:
                self._refresh()
            return self._tokens.access_token

    def forget_access_token(self) -> None:
        """Called after the service refused the access token: the next call refreshes."""
        with self._lock:
            if self._tokens is not None:
                self._tokens.access_expires_at = 0

    def _margin(self, lifetime: float) -> float:
        # Never more than half a token's life, so short-lived tokens are not refreshed on every call.
        return min(self.refresh_margin, lifetime / 2)

    def _login(self) -> None:
        issued_at = self.clock()
        body = self.transport.request(
            "POST",
            "/auth/token",
            json={
                "client_id": self.client_id,
                "client_secret": self._client_secret,
                "grant_type": "client_credentials",
            },
        ).body
        lifetime = float(body["expires_in"])
        self._tokens = _Tokens(
            body["access_token"],
            body["refresh_token"],
            issued_at + lifetime,
            issued_at + float(body.get("refresh_expires_in", lifetime)),
            self._margin(lifetime),
        )

    def _refresh(self) -> None:
        issued_at = self.clock()
        try:
            body = self.transport.request(
                "POST",
                "/auth/refresh",
                json={
                    "refresh_token": self._tokens.refresh_token,
                    "grant_type": "refresh_token",
                },
            ).body
        except Unauthorized:
            log.info("refresh token refused; logging in again")
            self._login()
            return
        except PriceKeeperError:
            if issued_at < self._tokens.access_expires_at:
                return  # the current token is still good; try refreshing again on the next call
            raise
        lifetime = float(body["expires_in"])
        self._tokens.access_token = body["access_token"]
        self._tokens.access_expires_at = issued_at + lifetime
        self._tokens.margin = self._margin(lifetime)

    def revoke(self, token: str, token_type_hint: str | None = None) -> None:
        """Revokes ``token`` (one of this client's), authenticated as this client."""
        body = {"token": token}
        if token_type_hint:
            body["token_type_hint"] = token_type_hint
        self.transport.request("POST", "/auth/revoke", json=body, headers=self.authorization())

    def close(self) -> bool:
        """Revokes the refresh token (ending its access tokens too). False if that failed."""
        with self._lock:
            if self._tokens is None:
                return True
            refresh_token = self._tokens.refresh_token
            try:
                self.revoke(refresh_token, "refresh_token")
            except PriceKeeperError as error:
                log.warning("could not revoke the refresh token on close: %s", error.code)
                return False
            finally:
                self._tokens = None
            return True
