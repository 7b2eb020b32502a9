"""The request pipeline: one step every API request passes before its handler runs.

For the route the request matched (``routes.Route``), ``admit``:

1. checks the path ids that become keys (``orgs.check_ids``: 400 before any store access);
2. authenticates the caller as the route declares (``Route.auth``): the provisioning key,
   or an access token allowed on the path's org and app (the query's ``app_id`` only where
   ``Route.app_in_query`` says so: elsewhere an app token naming itself in the query would
   read org-level data);
3. counts the request against the route's rate limit, keyed on the authenticated caller;
4. returns the caller as a ``Principal`` (``None`` for the provisioning key and open routes).

It runs before Powertools parses and validates the body, so a request without credentials
is a 401 whatever its body. The token endpoints (``Auth.CLIENT``) authenticate the client
themselves: that is their job. OAuth2 forms to the token endpoints, revocation included,
do not come here: ``oauth.py`` authenticates their client by its credentials (``api.lambda_entry``).
"""

from __future__ import annotations

from .. import ratelimit
from ..domain import auth, orgs
from ..domain.auth import Principal
from ..errors import ApiError
from ..routes import Auth, Route

PROVISIONING_CLIENT = "provisioning-key"  # the rate-limit counter of the provisioning key


def _header(event: dict, name: str) -> str | None:
    wanted = name.lower()
    return next((value for key, value in (event.get("headers") or {}).items() if key.lower() == wanted), None)


def _config_owner(claims: dict, org_id: str | None, app_id: str | None) -> tuple[str, str | None]:
    """Whose config a bearer request reads first: the path's org and app when the token may
    act on them (the entry the handler reads next), else the token's own."""
    own_app = claims.get("app_id")
    if org_id != claims["org_id"] or (own_app is not None and app_id != own_app):
        return claims["org_id"], own_app
    return org_id, app_id


def _org_limit(
    claims: dict, limit_name: str | None, org_id: str | None, app_id: str | None
) -> tuple[int | None, ApiError | None]:
    """(the requests the caller's org set for this limit, if any, from the org's cached
    config: ``_config_owner``, read with the token check when the container had none; the
    404 of a path naming an app or org that is not registered). Such a request is counted
    too, on the token's own config (the same org limits), and refused once counted: the
    404 comes from here, so the handler does not read the config again to find it missing."""
    if limit_name not in ratelimit.ORG_ADJUSTABLE or not ratelimit.enabled():
        return None, None
    owner, own = _config_owner(claims, org_id, app_id), (claims["org_id"], claims.get("app_id"))
    not_registered = None
    for config_of in dict.fromkeys([owner, own]):
        try:
            return orgs.effective_config(*config_of).rate_limits.get(limit_name), not_registered
        except ApiError as error:
            if error.status != 404:
                raise
            not_registered = not_registered or error
    return None, not_registered


def admit(route: Route | None, event: dict) -> Principal | None:
    """Check, authenticate and rate-limit one request (``ApiError`` when refused)."""
    if route is None:
        return None
    path = event.get("pathParameters") or {}
    query = event.get("queryStringParameters") or {}
    org_id = path.get("org_id")
    app_id = path.get("app_id") or (query.get("app_id") if route.app_in_query else None)
    if org_id is not None:
        orgs.check_ids(org_id, app_id)
    if route.auth == Auth.PROVISIONING_KEY:
        auth.require_provisioning_key(_header(event, "X-API-Key"))
        ratelimit.consume(PROVISIONING_CLIENT, limit_name=route.rate_limit)
        return None
    if route.auth not in (Auth.BEARER, Auth.BEARER_ANY):
        return None
    # a cold container reads the config of the path's org, which it needs next, in the token check's BatchGetItem
    along = (lambda claims: orgs.config_along(*_config_owner(claims, org_id, app_id))) if org_id is not None else None
    claims = auth.authenticate_bearer(_header(event, "Authorization"), along=along)
    # before the 403 and the 404: refusals count too
    limit, not_registered = _org_limit(claims, route.rate_limit, org_id, app_id)
    ratelimit.consume(claims["sub"], limit_name=route.rate_limit, requests=limit)
    if route.auth == Auth.BEARER:
        auth.check_access(claims, org_id, app_id)
    if not_registered is not None:
        raise not_registered
    return Principal(claims["org_id"], claims.get("app_id"))
