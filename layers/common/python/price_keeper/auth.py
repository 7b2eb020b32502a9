"""OAuth2 client credentials: secrets, JWTs, revocation and the per-request authorizer.

- Client secrets are 32 random bytes (base64), stored only as bcrypt hashes. During a
  rotation grace period the previous hash is kept beside the new one.
- Tokens are HS256 JWTs signed with a key from Secrets Manager (Powertools Parameters,
  cached). Access tokens live 1 h, refresh tokens 7 d; every token has a ``jti`` and an
  access token names the refresh token it came from (``rjti``), so revoking a refresh
  token ends the access tokens issued from it.
- Revocation is a RevokedTokens item with TTL = token expiry. "Not revoked" answers are
  cached for ``REVOCATION_CACHE_SECONDS`` per process (the seed's negative-lookup cache):
  another warm Lambda container may accept a just-revoked token for that long.
"""
from __future__ import annotations

import base64
import hmac
import os
import secrets
import time
import uuid
from typing import Annotated, Literal, NamedTuple

import bcrypt
import jwt
from aws_lambda_powertools.utilities import parameters
from pydantic import StringConstraints

from . import keys, ratelimit, storage, tables
from .aws import table
from .cache import TTLCache
from .errors import ApiError, forbidden, unauthorized
from .validation import StrictBody

ISSUER = "bedrock-cost-keeper"
ALGORITHM = "HS256"
ACCESS_TTL = 3600
REFRESH_TTL = 7 * 24 * 3600
ACCESS_SCOPES = ["read:aggregates", "write:costs", "read:model-selection"]
REVOCATION_CACHE_SECONDS = 30
SECRET_CACHE_SECONDS = 300
BCRYPT_MAX_BYTES = 72

_not_revoked = TTLCache(REVOCATION_CACHE_SECONDS)
_revoked = TTLCache(REFRESH_TTL)


def _bcrypt_rounds() -> int:
    return int(os.environ.get("BCRYPT_ROUNDS", "12"))


# A valid hash to compare against when the client is unknown, so that an unknown
# client id costs the same bcrypt time as a wrong secret (no enumeration by timing).
_DUMMY_HASH: bytes | None = None


def _dummy_hash() -> bytes:
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = bcrypt.hashpw(b"unknown-client", bcrypt.gensalt(_bcrypt_rounds()))
    return _DUMMY_HASH


# --- secrets -----------------------------------------------------------------------

def new_client_secret() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def hash_secret(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(_bcrypt_rounds())).decode()


def _matches(secret: bytes, hashed: str | None) -> bool:
    return bool(hashed) and bcrypt.checkpw(secret, hashed.encode())


def _secret(env: str, default_name: str) -> str:
    return parameters.get_secret(os.environ.get(env, default_name), max_age=SECRET_CACHE_SECONDS)


def signing_key() -> str:
    return _secret("JWT_SECRET_NAME", "price-keeper/jwt-signing-key")


def provisioning_key() -> str:
    return _secret("PROVISIONING_SECRET_NAME", "price-keeper/provisioning-api-key")


def require_provisioning_key(presented: str | None) -> None:
    """401 unless ``X-API-Key`` equals the provisioning key (constant-time compare)."""
    if not presented or not hmac.compare_digest(presented.encode(), provisioning_key().encode()):
        raise ApiError(401, "UNAUTHORIZED", "Missing or invalid X-API-Key")
    ratelimit.consume("provisioning-key")


# --- clients -----------------------------------------------------------------------

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
    from .validation import is_app_id, is_uuid

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


def _credential_item(principal: Principal) -> dict | None:
    resource = keys.app_resource(principal.app_id) if principal.app_id else keys.ROOT_RESOURCE
    return table(tables.CONFIG).get_item(
        Key={"org_key": keys.org_key(principal.org_id), "resource_key": resource}, ConsistentRead=True,
    ).get("Item")


def authenticate_client(client_id: str, client_secret: str, now: float | None = None) -> Principal:
    """The principal for valid credentials; 401 otherwise (same cost for every failure)."""
    principal = parse_client_id(client_id)
    ratelimit.consume(principal.client_id if principal else "malformed-client-id")
    item = _credential_item(principal) if principal else None
    presented = client_secret.encode()
    if not item or len(presented) > BCRYPT_MAX_BYTES:  # bcrypt refuses longer input; ours are 44 bytes
        bcrypt.checkpw(presented[:BCRYPT_MAX_BYTES], _dummy_hash())
        raise unauthorized("Invalid client credentials")
    if _matches(presented, item.get("client_secret_hash")):
        return principal
    grace_until = int(item.get("client_secret_rotation_grace_expires_at_epoch", 0))
    if grace_until > (now or time.time()) and _matches(presented, item.get("previous_client_secret_hash")):
        return principal
    raise unauthorized("Invalid client credentials")


# --- tokens ------------------------------------------------------------------------

def _encode(claims: dict) -> str:
    return jwt.encode(claims, signing_key(), algorithm=ALGORITHM)


def _access_token(principal: Principal, refresh_jti: str, now: int) -> str:
    return _encode({
        "sub": principal.client_id, "org_id": principal.org_id, "app_id": principal.app_id,
        "scope": ACCESS_SCOPES, "token_type": "access", "iat": now, "exp": now + ACCESS_TTL,
        "iss": ISSUER, "jti": str(uuid.uuid4()), "rjti": refresh_jti,
    })


def issue_tokens(principal: Principal) -> dict:
    now = int(time.time())
    refresh_jti = str(uuid.uuid4())
    refresh_token = _encode({
        "sub": principal.client_id, "org_id": principal.org_id, "app_id": principal.app_id,
        "token_type": "refresh", "iat": now, "exp": now + REFRESH_TTL, "iss": ISSUER, "jti": refresh_jti,
    })
    return {
        "access_token": _access_token(principal, refresh_jti, now),
        "refresh_token": refresh_token,
        "token_type": "Bearer",
        "expires_in": ACCESS_TTL,
        "refresh_expires_in": REFRESH_TTL,
        "scope": principal.scope,
    }


def decode(token: str, token_type: str) -> dict:
    """Verified claims of a token of the given type; 401 for anything else.

    Only HS256 is accepted (so ``alg: none`` and algorithm swaps fail), and ``exp``,
    ``iat``, ``iss``, ``sub`` and ``jti`` are required.
    """
    try:
        claims = jwt.decode(
            token, signing_key(), algorithms=[ALGORITHM], issuer=ISSUER,
            options={"require": ["exp", "iat", "iss", "sub", "jti"]},
        )
    except jwt.ExpiredSignatureError:
        raise unauthorized("Token expired") from None
    except jwt.PyJWTError:
        raise unauthorized("Invalid token") from None
    if claims.get("token_type") != token_type:
        raise unauthorized(f"Expected a {token_type} token")
    if parse_client_id(claims["sub"]) != Principal(claims.get("org_id"), claims.get("app_id")):
        raise unauthorized("Invalid token")
    _ensure_not_revoked(claims)
    return claims


def refresh_access_token(refresh_token: str) -> dict:
    claims = decode(refresh_token, "refresh")
    ratelimit.consume(claims["sub"])
    principal = Principal(claims["org_id"], claims.get("app_id"))
    return {
        "access_token": _access_token(principal, claims["jti"], int(time.time())),
        "token_type": "Bearer",
        "expires_in": ACCESS_TTL,
    }


def _ensure_not_revoked(claims: dict) -> None:
    jtis = [claims["jti"]] + ([claims["rjti"]] if claims.get("rjti") else [])
    unknown = [jti for jti in jtis if not _not_revoked.get(jti)]
    if any(_revoked.get(jti) for jti in unknown):
        raise unauthorized("Token revoked")
    if not unknown:
        return
    # batch_get retries unprocessed keys and answers 503 if some stay unread: an incomplete
    # read must never pass for "not revoked" (nor be cached as such).
    found = storage.batch_get(tables.REVOKED_TOKENS, [{"token_jti": jti} for jti in unknown],
                              attributes=["token_jti"])
    if found:
        for item in found:
            _revoked.put(item["token_jti"], True)
        raise unauthorized("Token revoked")
    for jti in unknown:
        _not_revoked.put(jti, True)


def revoke(caller: dict, token: str) -> None:
    """Revoke ``token`` (access or refresh) on behalf of the caller's access token.

    The token must verify and belong to the caller's client; revoking it twice is fine.
    """
    try:
        claims = jwt.decode(token, signing_key(), algorithms=[ALGORITHM], issuer=ISSUER,
                            options={"require": ["exp", "iat", "iss", "sub", "jti"]})
    except jwt.ExpiredSignatureError:
        return  # already unusable; nothing to store
    except jwt.PyJWTError:
        raise ApiError(400, "INVALID_REQUEST", "token is not a token issued by this service") from None
    if claims["sub"] != caller["sub"]:
        raise forbidden("Token belongs to another client")
    now = int(time.time())
    table(tables.REVOKED_TOKENS).put_item(Item={
        "token_jti": claims["jti"],
        "token_type": claims.get("token_type", "access"),
        "client_id": claims["sub"],
        "revoked_at_epoch": now,
        "original_expiry_epoch": int(claims["exp"]),
        tables.TTL_ATTRIBUTE: int(claims["exp"]),
    })
    _not_revoked.discard(claims["jti"])
    _revoked.put(claims["jti"], True)


# --- the authorizer step of every runtime endpoint ---------------------------------

def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized("Missing Authorization header")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("Authorization must be 'Bearer <access token>'")
    return token.strip()


def authenticate_bearer(authorization: str | None) -> dict:
    """Claims of the caller's valid, unrevoked access token, counted against its rate limit."""
    claims = decode(bearer_token(authorization), "access")
    ratelimit.consume(claims["sub"])
    return claims


def authorize(authorization: str | None, org_id: str, app_id: str | None = None) -> dict:
    """Claims of a valid, unrevoked access token allowed on ``org_id``/``app_id``.

    An org token may act on its org and every app in it; an app token only on its own
    app. Anything else is 403 (the token is valid, the resource is not its own).
    """
    claims = authenticate_bearer(authorization)
    if claims["org_id"] != org_id:
        raise forbidden()
    token_app = claims.get("app_id")
    if token_app is not None and token_app != app_id:
        raise forbidden()
    return claims


# --- request bodies of the auth endpoints ------------------------------------------

# Far above any id or token this service issues; longer input is refused before any work.
_Credential = Annotated[str, StringConstraints(min_length=1, max_length=256)]
_Token = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class TokenRequest(StrictBody):
    client_id: _Credential
    client_secret: _Credential
    grant_type: Literal["client_credentials"]


class RefreshRequest(StrictBody):
    refresh_token: _Token
    grant_type: Literal["refresh_token"]


class RevokeRequest(StrictBody):
    token: _Token
    token_type_hint: Literal["access_token", "refresh_token"] | None = None
