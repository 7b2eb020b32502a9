"""The OpenAPI document of the whole API, as the service really answers.

Powertools generates paths and request schemas from the handlers' routers and pydantic
models; this module replaces its default 422 validation response with the error
responses the service actually sends (``api_spec.md`` error schema, 400 for bad input),
and declares each operation's security from its route (``routes.Route.auth``, what the
request pipeline enforces), so the document and the enforcement cannot disagree. The token
endpoints also take OAuth2 forms (``oauth.ENDPOINTS``): their form bodies and HTTP Basic
client authentication are declared beside the JSON ones. Its ``servers`` is the stage the
document was asked through (``/dev``), as Powertools' own Swagger handler gives it, so
"Try it out" and generated clients call the stage.
"""

from __future__ import annotations

import json

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn, HTTPBase, HTTPBearer, Server

from ..routes import ROUTES, Auth
from . import oauth

TITLE = "Bedrock Price Keeper"
SECURITY_SCHEMES = {
    "bearerAuth": HTTPBearer(bearerFormat="JWT"),
    "provisioningKey": APIKey(name="X-API-Key", **{"in": APIKeyIn.header}),
    "clientBasic": HTTPBase(scheme="basic"),  # client_secret_basic (oauth.py)
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message", "timestamp"],
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "error_description": {"type": "string"},  # OAuth2 forms (oauth.py)
        "details": {},
        "timestamp": {"type": "string"},
        "request_id": {"type": "string"},
        "retry_after": {},
        "hint": {"type": "string"},
    },
}
SECURITY = {
    Auth.BEARER: [{"bearerAuth": []}],
    Auth.BEARER_ANY: [{"bearerAuth": []}],
    Auth.PROVISIONING_KEY: [{"provisioningKey": []}],
}
# An OAuth2 form's client authenticates with HTTP Basic or in the body (client_secret_post,
# which no security scheme can say: hence the empty requirement).
FORM_SECURITY = [{"clientBasic": []}, {}]
ERROR_RESPONSES = {
    "400": "Invalid request or configuration",
    "401": "Missing or invalid authentication",
    "403": "Token not allowed on this resource",
    "404": "Organization, application, route or data not found",
    "409": "Already exists",
    "429": "Quota or rate limit exceeded",
    "500": "Internal error",
    "503": "Storage temporarily unavailable",
}


def document(app: APIGatewayRestResolver, version: str, base_path: str = "") -> dict:
    """The document of ``app``'s routes, served under ``base_path`` (the stage prefix, or "")."""
    schema = json.loads(
        app.get_openapi_json_schema(
            title=TITLE, version=version, security_schemes=SECURITY_SCHEMES, servers=[Server(url=base_path or "/")]
        )
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        components.pop(name, None)
    components["Error"] = ERROR_SCHEMA
    error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    paths = schema.get("paths", {})
    for route in ROUTES:
        operation = paths.get(route.path, {}).get(route.method.lower())
        if operation is None:
            continue
        if route.auth in SECURITY:
            operation["security"] = SECURITY[route.auth]
        if oauth.accepts(route):
            _declare_form(operation, oauth.ENDPOINTS[route.path].form, components)
    for operations in paths.values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.get("204", {}).pop("content", None)  # no body (Powertools gives every response one)
            for status, description in ERROR_RESPONSES.items():
                responses.setdefault(status, {"description": description, "content": error_ref})
    return schema


def _declare_form(operation: dict, form: type, components: dict) -> None:
    """The operation also takes ``form`` as an OAuth2 form body, its client authenticated."""
    components[form.__name__] = form.model_json_schema(ref_template="#/components/schemas/{model}")
    reference = {"$ref": f"#/components/schemas/{form.__name__}"}
    operation["requestBody"]["content"][oauth.CONTENT_TYPE] = {"schema": reference}
    operation["security"] = operation.get("security", []) + FORM_SECURITY
