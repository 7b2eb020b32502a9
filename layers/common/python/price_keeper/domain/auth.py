"""OAuth2 client credentials: secrets, JWTs, revocation and the per-request authorizer.

- Client secrets are stored only as bcrypt hashes with a short fingerprint, which picks the
  one hash to check during a rotation grace period (one bcrypt check per attempt). Failed
  attempts are limited per client *and* source address: a client id is public, so a limit
  on it alone would be a lock-out switch.
- Tokens are HS256 JWTs (key from Secrets Manager). Access tokens live 1 h and name their
  refresh token (``rjti``), so revoking it ends them; ``auth_time_ms`` is when the client
  presented its secret.
- Revocation is a RevokedTokens item (TTL = token expiry) plus a per-client cutoff. "Not
  revoked" is cached for ``REVOCATION_CACHE_SECONDS`` per container; ``/auth/refresh``
  always reads what is stored.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import secrets
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import bcrypt
import jwt

from .. import audit, ratelimit
from ..aws import secrets as secrets_store
from ..cache import TTLCache
from ..errors import ApiError, forbidden, invalid_request, unauthorized
from ..metric_names import TOKENS_REVOKED
from ..observability import count
from ..store import config_items, revocations
from ..store.dynamo import ReadAlong, batch_get_many
from ..validation import is_app_id, is_uuid

ISSUER = "bedrock-cost-keeper"
ALGORITHM = "HS256"
ACCESS_TTL = 3600
REFRESH_TTL = 7 * 24 * 3600
ACCESS_SCOPES = ["read:aggregates", "write:costs", "read:model-selection"]
REVOCATION_CACHE_SECONDS = 30
BCRYPT_MAX_BYTES = 72
FINGERPRINT_CHARS = 4
# POST /auth/token limits (config.yaml rate_limits).
FAILED_ATTEMPTS_LIMIT = "auth_token"  # per client id and source address
SOURCE_LIMIT = "auth_token_source"  # every attempt, per source address
CLIENT_LIMIT = "auth_token_client"  # tokens issued, per client id (api_spec.md: 10 a minute)
REFRESH_LIMIT = "auth_refresh"  # per client

_not_revoked = TTLCache(REVOCATION_CACHE_SECONDS)
_revoked = TTLCache(REFRESH_TTL)
_cutoffs = TTLCache(REVOCATION_CACHE_SECONDS)  # client id -> its cutoff item ({} when none)


def _bcrypt_rounds() -> int:
    return int(os.environ.get("BCRYPT_ROUNDS", "12"))


@functools.lru_cache(maxsize=1)
def _dummy_hash() -> bytes:
    """A valid hash to compare against when the client is unknown, so that an unknown client id
    costs the same bcrypt time as a wrong secret (no enumeration by timing)."""
    return bcrypt.hashpw(b"unknown-client", bcrypt.gensalt(_bcrypt_rounds()))


def new_client_secret() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def secret_fingerprint(secret: str) -> str:
    """A short digest stored beside a secret's hash, picking which hash to check during a rotation
    grace period (16 bits of a 256-bit random secret tell nothing about it)."""
    return hashlib.sha256(secret.encode()).hexdigest()[:FINGERPRINT_CHARS]


def secret_attributes(secret: str) -> dict:
    """The Config item attributes that store a client secret."""
    hashed = bcrypt.hashpw(secret.encode(), bcrypt.gensalt(_bcrypt_rounds())).decode()
    return {"client_secret_hash": hashed, "client_secret_fingerprint": secret_fingerprint(secret)}


def require_provisioning_key(presented: str | None) -> None:
    """401 unless ``X-API-Key`` equals the provisioning key (constant-time compare)."""
    if not presented or not hmac.compare_digest(presented.encode(), secrets_store.provisioning_key().encode()):
        raise ApiError(401, "UNAUTHORIZED", "Missing or invalid X-API-Key")
    audit.note(authenticated=True)


class Principal(NamedTuple):
    org_id: str
    app_id: str | None

    @property
    def client_id(self) -> str:
        return client_id_for(self.org_id, self.app_id)

    @property
    def scope(self) -> str:
        return f"org:{self.org_id}" + (f" app:{self.app_id}" if self.app_id else "")


def client_id_for(org_id: str, app_id: str | None = None) -> str:
    return f"org-{org_id}" + (f"-app-{app_id}" if app_id else "")


def parse_client_id(client_id: str) -> Principal | None:
    """``org-{uuid}`` or ``org-{uuid}-app-{app_id}``; ``None`` when malformed."""
    if not isinstance(client_id, str) or not client_id.startswith("org-"):
        return None
    org_id, rest = client_id[4:40], client_id[40:]
    if not is_uuid(org_id):
        return None
    if not rest:
        return Principal(org_id, None)
    if rest.startswith("-app-") and is_app_id(rest[5:]):
        return Principal(org_id, rest[5:])
    return None


class Authenticated(NamedTuple):
    principal: Principal
    # End of the rotation grace period when the previous secret was presented: no token
    # issued from that secret may outlive it. None for the current secret.
    not_after: int | None


def _hash_to_check(item: dict, secret: str, now: float) -> tuple[str, int | None]:
    """The one stored hash the presented secret can match, and its grace period end."""
    grace_until = int(item.get("client_secret_rotation_grace_expires_at_epoch", 0))
    if grace_until > now and item.get("previous_client_secret_fingerprint") == secret_fingerprint(secret):
        return item["previous_client_secret_hash"], grace_until
    return item["client_secret_hash"], None


def authenticate_client(
    client_id: str, client_secret: str, *, source_ip: str, now: float | None = None
) -> Authenticated:
    """The client for valid credentials; 401 otherwise. Every attempt costs one bcrypt check
    (unknown clients check a dummy hash); the limits are keyed on the source address, so wrong
    secrets sent from elsewhere never lock the real client out."""
    ratelimit.consume(f"source:{source_ip}", limit_name=SOURCE_LIMIT)
    principal = parse_client_id(client_id)
    failure = ratelimit.consume(
        f"{principal.client_id if principal else 'malformed-client-id'}@{source_ip}",
        limit_name=FAILED_ATTEMPTS_LIMIT,
        refundable=True,
    )
    item = config_items.client_item(principal.org_id, principal.app_id) if principal else None
    presented = client_secret.encode()
    if not item or len(presented) > BCRYPT_MAX_BYTES:  # bcrypt refuses longer input; ours are 44 bytes
        bcrypt.checkpw(presented[:BCRYPT_MAX_BYTES], _dummy_hash())
        raise unauthorized("Invalid client credentials")
    hashed, not_after = _hash_to_check(item, client_secret, time.time() if now is None else now)
    if not bcrypt.checkpw(presented, hashed.encode()):
        raise unauthorized("Invalid client credentials")
    ratelimit.refund(failure)
    return Authenticated(principal, not_after)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _encode(claims: dict) -> str:
    return jwt.encode(claims, secrets_store.signing_key(), algorithm=ALGORITHM)


def _claims(principal: Principal, token_type: str, now: int, exp: int, auth_time_ms: int) -> dict:
    return {
        "sub": principal.client_id,
        "org_id": principal.org_id,
        "app_id": principal.app_id,
        "token_type": token_type,
        "iat": now,
        "exp": exp,
        "auth_time_ms": auth_time_ms,
        "iss": ISSUER,
        "jti": str(uuid.uuid4()),
    }


def _access(principal: Principal, refresh_jti: str, now: int, exp: int, auth_time_ms: int) -> dict:
    """The access token part of the token and refresh replies."""
    claims = {**_claims(principal, "access", now, exp, auth_time_ms), "scope": ACCESS_SCOPES, "rjti": refresh_jti}
    return {"access_token": _encode(claims), "token_type": "Bearer", "expires_in": exp - now}


def grant_tokens(client: Authenticated) -> dict:
    """The token endpoint's answer, at most ``CLIENT_LIMIT`` a minute per client id (counted
    after the secret checked, so only the client itself can spend it)."""
    ratelimit.consume(client.principal.client_id, limit_name=CLIENT_LIMIT)
    return issue_tokens(client.principal, not_after=client.not_after)


def issue_tokens(principal: Principal, not_after: int | None = None) -> dict:
    """An access and a refresh token; neither lives past ``not_after`` (an old secret's grace end)."""
    authenticated_ms = now_ms()
    now = authenticated_ms // 1000
    refresh_exp = min(now + REFRESH_TTL, not_after or now + REFRESH_TTL)
    access_exp = min(now + ACCESS_TTL, refresh_exp)
    refresh = _claims(principal, "refresh", now, refresh_exp, authenticated_ms)
    return {
        **_access(principal, refresh["jti"], now, access_exp, authenticated_ms),
        "refresh_token": _encode(refresh),
        "refresh_expires_in": refresh_exp - now,
        "scope": principal.scope,
    }


def _verified_claims(token: str) -> dict:
    """The claims of a token of this service (HS256 only; exp, iat, iss, sub and jti required)."""
    return jwt.decode(
        token,
        secrets_store.signing_key(),
        algorithms=[ALGORITHM],
        issuer=ISSUER,
        options={"require": ["exp", "iat", "iss", "sub", "jti"]},
    )


def decode(
    token: str, token_type: str, *, fresh: bool = False, along: Callable[[dict], ReadAlong | None] | None = None
) -> dict:
    """Verified claims of a token of the given type; 401 for anything else. ``fresh``: check
    revocations with a consistent read, not cached answers. ``along``: given the claims, a read
    the revocation check carries in its BatchGetItem when it makes one."""
    try:
        claims = _verified_claims(token)
    except jwt.ExpiredSignatureError:
        raise unauthorized("Token expired") from None
    except jwt.PyJWTError:
        raise unauthorized("Invalid token") from None
    if claims.get("token_type") != token_type:
        raise unauthorized(f"Expected a {token_type} token")
    if parse_client_id(claims["sub"]) != Principal(claims.get("org_id"), claims.get("app_id")):
        raise unauthorized("Invalid token")
    _ensure_not_revoked(claims, fresh=fresh, along=along(claims) if along else None)
    return claims


def refresh_access_token(refresh_token: str, client: Principal | None = None) -> dict:
    """A new access token for a refresh token, checked against revocations as stored now, so
    revoke-tokens ends refreshing at once. ``client``: the authenticated client of an OAuth2
    form, whose own token it must be."""
    claims = decode(refresh_token, "refresh", fresh=True)
    if client is not None and claims["sub"] != client.client_id:
        raise unauthorized("Refresh token was issued to another client")
    ratelimit.consume(claims["sub"], limit_name=REFRESH_LIMIT)
    principal = Principal(claims["org_id"], claims.get("app_id"))
    now = int(time.time())
    exp = min(now + ACCESS_TTL, int(claims["exp"]))
    return _access(principal, claims["jti"], now, exp, _auth_time_ms(claims))


def _auth_time_ms(claims: dict) -> int:
    """When the client authenticated with its secret for this token (else its issue second)."""
    return int(claims.get("auth_time_ms") or int(claims["iat"]) * 1000)


def _ensure_not_revoked(claims: dict, *, fresh: bool, along: ReadAlong | None = None) -> None:
    """401 for a revoked token (``jti`` or ``rjti``) or one authenticated before its client's
    cutoff: one BatchGetItem, cached unless ``fresh``; an incomplete read is a 503, never "not revoked"."""
    jtis = [claims["jti"]] + ([claims["rjti"]] if claims.get("rjti") else [])
    if any(_revoked.get(jti) for jti in jtis):
        raise unauthorized("Token revoked")
    client_id = claims["sub"]
    unknown = jtis if fresh else [jti for jti in jtis if not _not_revoked.get(jti)]
    cutoff = None if fresh else _cutoffs.get(client_id)
    if unknown or cutoff is None:
        lookup = revocations.lookup(unknown, client_id, consistent=fresh)
        found, *carried = batch_get_many([lookup, *([along.read] if along else [])])
        if along:
            along.found(carried[0])
        revoked, cutoff = revocations.found(found, client_id)
        _cutoffs.put(client_id, cutoff)
        if revoked:
            for jti in revoked:
                _revoked.put(jti, True)
            raise unauthorized("Token revoked")
        for jti in unknown:
            _not_revoked.put(jti, True)
    if _auth_time_ms(claims) < _effective_cutoff_ms(cutoff, time.time()):
        raise unauthorized("Token revoked")


def revoke(caller: Principal, token: str, *, ignore_invalid: bool = False) -> None:
    """Revoke ``token`` (access or refresh) for the caller, whose client it must belong to (403);
    twice is fine. Not a token of ours: 400, or nothing with ``ignore_invalid`` (RFC 7009 §2.2)."""
    try:
        claims = _verified_claims(token)
    except jwt.ExpiredSignatureError:
        return  # already unusable; nothing to store
    except jwt.PyJWTError:
        if ignore_invalid:
            return
        raise invalid_request("token is not a token issued by this service") from None
    if claims["sub"] != caller.client_id:
        raise forbidden("Token belongs to another client")
    revocations.revoke(
        claims["jti"],
        {
            "token_type": claims.get("token_type", "access"),
            "client_id": claims["sub"],
            "revoked_at_epoch": int(time.time()),
            "original_expiry_epoch": int(claims["exp"]),
        },
        expires_at=int(claims["exp"]),
    )
    _not_revoked.discard(claims["jti"])
    _revoked.put(claims["jti"], True)
    count(TOKENS_REVOKED)


# --- per-client cutoffs: revoke-tokens and rotation ---------------------------------
#
# One RevokedTokens item per client ends every token authenticated before a millisecond:
# ``cutoff_ms`` at once, ``pending_cutoff_ms`` from ``pending_cutoff_at_epoch`` on (rotation
# with grace), ``superseded_cutoff_ms`` at once (a pending cutoff a new rotation replaced).


def _effective_cutoff_ms(item: dict, now: float) -> int:
    pending = int(item.get("pending_cutoff_ms", 0)) if now >= int(item.get("pending_cutoff_at_epoch", 0)) else 0
    return max(int(item.get("cutoff_ms", 0)), int(item.get("superseded_cutoff_ms", 0)), pending)


def cutoff_update(client_id: str, before_ms: int, effective_at: int | None = None) -> dict:
    """The transaction action ending the client's tokens authenticated before ``before_ms``, at
    once or from ``effective_at`` on; the item expires ``REFRESH_TTL`` after, as they do."""
    return revocations.cutoff_update(client_id, before_ms, effective_at, before_ms // 1000 + REFRESH_TTL)


def forget_cutoff(client_id: str) -> None:
    """Drop this container's cached cutoff after writing a new one."""
    _cutoffs.discard(client_id)


def authenticate_bearer(authorization: str | None, along: Callable[[dict], ReadAlong | None] | None = None) -> dict:
    """Claims of the caller's valid, unrevoked access token (``along``: as ``decode``'s)."""
    if not authorization:
        raise unauthorized("Missing Authorization header")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("Authorization must be 'Bearer <access token>'")
    return decode(token.strip(), "access", along=along)


def check_access(claims: dict, org_id: str, app_id: str | None = None) -> None:
    """403 unless the token may act on ``org_id``/``app_id`` (an app token only on its own app)."""
    token_app = claims.get("app_id")
    if claims["org_id"] != org_id or (token_app is not None and token_app != app_id):
        raise forbidden()
