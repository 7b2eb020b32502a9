"""Every HTTP route of the service and the Lambda function that serves it.

The CDK stack creates one API Gateway method per route, integrated with the named
function (``lambdas/<function>/handler.py``); the local server dispatches with the same
list, so the deployed and the local API cannot drift apart. Handlers register their
Powertools routes with ``rule(path)`` so the paths are written only here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

API = "/api/v1"
ORG = f"{API}/orgs/{{org_id}}"
APP = f"{ORG}/apps/{{app_id}}"

ROOT = "/"
HEALTH = "/health"
AUTH_TOKEN = "/auth/token"
AUTH_REFRESH = "/auth/refresh"
AUTH_REVOKE = "/auth/revoke"
OPENAPI = "/openapi.json"
DOCS = "/docs"
CONSOLE = "/console"
ORG_CONFIG = ORG
APP_CONFIG = APP
ORG_ROTATE = f"{ORG}/credentials/rotate"
APP_ROTATE = f"{APP}/credentials/rotate"
ORG_REVOKE_TOKENS = f"{ORG}/credentials/revoke-tokens"
APP_REVOKE_TOKENS = f"{APP}/credentials/revoke-tokens"
ORG_AGGREGATES_TODAY = f"{ORG}/aggregates/today"
ORG_AGGREGATES_DATE = f"{ORG}/aggregates/{{date}}"
APP_AGGREGATES_TODAY = f"{APP}/aggregates/today"
APP_AGGREGATES_DATE = f"{APP}/aggregates/{{date}}"
MODEL_SELECTION = f"{APP}/model-selection"
INFERENCE_PROFILES = f"{APP}/inference-profiles"
USAGE = f"{APP}/usage"
USAGE_BATCH = f"{APP}/usage/batch"
RESERVATIONS = f"{APP}/reservations"
RESERVATION = f"{RESERVATIONS}/{{reservation_id}}"
QUOTA_BOOSTS = f"{ORG}/quota-boosts"
USAGE_VOID = f"{ORG}/usage/void"
SPEND_REPORT = f"{ORG}/reports/spend"
ALERTS = f"{ORG}/alerts"
RECONCILIATION = f"{API}/reconciliation"


class Auth:
    """How a route authenticates its caller (the request pipeline, ``pipeline.admit``, does it
    before the body is even parsed; the OpenAPI security comes from the same value)."""

    NONE = "none"
    PROVISIONING_KEY = "provisioning_key"  # X-API-Key
    BEARER = "bearer"  # an access token of the path's org; an app token only for its own app
    BEARER_ANY = "bearer_any"  # any valid access token (the token names the client)
    CLIENT = "client"  # the token endpoints: authenticating the client is the handler's job (oauth.py's for forms)


class Route(NamedTuple):
    method: str
    path: str
    function: str
    auth: str = Auth.NONE
    rate_limit: str | None = None  # a key of config.yaml ``rate_limits``; None: unlimited
    audit: str | None = None  # the action an audit line names (audit.py); None: not audited
    # The route names its app in the query (``?app_id=``), so an app token may use it for its
    # own app. Only the spend report: on every other org-level route the query is no credential.
    app_in_query: bool = False


def _admin(method: str, path: str, function: str, rate_limit: str, audit: str) -> Route:
    return Route(method, path, function, Auth.PROVISIONING_KEY, rate_limit, audit)


def _bearer(method: str, path: str, function: str, rate_limit: str, app_in_query: bool = False) -> Route:
    return Route(method, path, function, Auth.BEARER, rate_limit, app_in_query=app_in_query)


ROUTES: tuple[Route, ...] = (
    Route("GET", ROOT, "health"),
    Route("GET", HEALTH, "health"),
    Route("GET", OPENAPI, "docs"),
    Route("GET", DOCS, "docs"),
    Route("GET", CONSOLE, "docs"),
    Route("POST", AUTH_TOKEN, "auth_token", Auth.CLIENT, "auth_token"),
    Route("POST", AUTH_REFRESH, "auth_refresh", Auth.CLIENT, "auth_refresh"),
    Route("POST", AUTH_REVOKE, "auth_revoke", Auth.BEARER_ANY, "auth_revoke"),
    _admin("PUT", ORG_CONFIG, "put_org", "put_org", "org.put"),
    _admin("PUT", APP_CONFIG, "put_app", "put_app", "app.put"),
    _admin("POST", ORG_ROTATE, "rotate_credentials", "rotate", "org.rotate_credentials"),
    _admin("POST", APP_ROTATE, "rotate_credentials", "rotate", "app.rotate_credentials"),
    _admin("POST", ORG_REVOKE_TOKENS, "revoke_tokens", "revoke_tokens", "org.revoke_tokens"),
    _admin("POST", APP_REVOKE_TOKENS, "revoke_tokens", "revoke_tokens", "app.revoke_tokens"),
    _admin("POST", QUOTA_BOOSTS, "quota_boosts", "quota_boosts", "quota_boost.create"),
    _admin("POST", USAGE_VOID, "void_usage", "void_usage", "usage.void"),
    _bearer("GET", ORG_AGGREGATES_TODAY, "aggregates", "aggregates"),
    _bearer("GET", ORG_AGGREGATES_DATE, "aggregates", "aggregates"),
    _bearer("GET", APP_AGGREGATES_TODAY, "aggregates", "aggregates"),
    _bearer("GET", APP_AGGREGATES_DATE, "aggregates", "aggregates"),
    _bearer("GET", MODEL_SELECTION, "model_selection", "model_selection"),
    _bearer("POST", INFERENCE_PROFILES, "inference_profiles", "profiles"),
    _bearer("POST", USAGE, "usage", "usage"),
    _bearer("POST", USAGE_BATCH, "usage_batch", "usage_batch"),
    _bearer("POST", RESERVATIONS, "reservations", "reservations"),
    _bearer("DELETE", RESERVATION, "reservations", "reservations"),
    _bearer("GET", SPEND_REPORT, "spend_report", "aggregates", app_in_query=True),
    _bearer("GET", ALERTS, "alerts", "aggregates"),
    Route("GET", RECONCILIATION, "reconciliation", Auth.PROVISIONING_KEY, "reconciliation"),
)

# Scheduled functions (EventBridge), not behind API Gateway.
JOBS: tuple[str, ...] = ("aggregator", "pricing_fetcher", "reconciler", "bill")

HTTP_FUNCTIONS: tuple[str, ...] = tuple(dict.fromkeys(route.function for route in ROUTES))

_PARAM = re.compile(r"\{(\w+)\}")


def rule(path: str) -> str:
    """API Gateway path ``/orgs/{org_id}`` as a Powertools rule ``/orgs/<org_id>``."""
    return _PARAM.sub(r"<\1>", path)


def match(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """Route and path parameters for a request, preferring literal segments over
    parameters as API Gateway does (``aggregates/today`` before ``aggregates/{date}``)."""
    segments = path.rstrip("/").split("/") if path != "/" else [""]
    best = None
    for route in ROUTES:
        if route.method != method:
            continue
        pattern = route.path.rstrip("/").split("/") if route.path != "/" else [""]
        if len(pattern) != len(segments):
            continue
        params, literal_hits = {}, 0
        for want, got in zip(pattern, segments, strict=True):
            name = _PARAM.fullmatch(want)
            if name:
                if not got:
                    break
                params[name.group(1)] = got
            elif want == got:
                literal_hits += 1
            else:
                break
        else:
            if best is None or literal_hits > best[2]:
                best = (route, params, literal_hits)
    return (best[0], best[1]) if best else None


def route_for(method: str, resource: str) -> Route | None:
    """The route whose API Gateway resource path is ``resource`` (``event["resource"]``)."""
    return next((r for r in ROUTES if r.method == method and r.path == resource), None)


def allowed_methods(path: str) -> list[str]:
    return sorted({m for m in ("GET", "POST", "PUT", "DELETE", "PATCH") if match(m, path)})
