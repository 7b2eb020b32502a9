"""OAuth 2.0 form requests to the token endpoints, as standard OAuth2 client libraries send
them: RFC 6749 (client authentication §2.3, the client credentials grant §4.4, refreshing
§6, errors §5.2) and RFC 7009 (revocation).

The JSON requests of ``api_spec.md`` (``TokenRequest`` etc.) are answered by ``lambdas/auth_*``.
A request with an ``application/x-www-form-urlencoded`` body to a path of ``ENDPOINTS`` is
answered here, from ``api.lambda_entry``:

- ``POST /auth/token`` ``grant_type=client_credentials``: the spec's token reply;
- ``POST /auth/refresh`` ``grant_type=refresh_token&refresh_token=…``: the spec's refresh reply;
- ``POST /auth/revoke`` ``token=…[&token_type_hint=…]``: ``200 {}`` (RFC 7009), also for a
  string that is no token of this service.

Each authenticates the client with exactly one method (§2.3): HTTP Basic
(``client_secret_basic``) or ``client_id`` and ``client_secret`` in the body
(``client_secret_post``), by ``auth.authenticate_client``, as the JSON token request does:
one bcrypt check, the same per-address and failed-attempt limits. A form parameter appears
at most once, an empty one counts as omitted, an unrecognized one is ignored (§3.2).

Errors keep ``api_spec.md``'s error schema, but ``error`` is the RFC 6749 §5.2 code that
OAuth2 libraries read, with the RFC's ``error_description`` beside ``message``:
``invalid_request``, ``invalid_client`` (401 with ``WWW-Authenticate: Basic``),
``invalid_grant``, ``unsupported_grant_type`` and RFC 7009's ``unsupported_token_type``. A
rate limit (429) and the store (503) keep the spec's codes: the RFCs have none for them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, NamedTuple
from urllib.parse import parse_qsl, unquote

from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent
from pydantic import ConfigDict, Field, ValidationError

from .. import ratelimit, routes
from ..domain import auth, orgs
from ..errors import ApiError, validation_details
from ..routes import Route
from ..validation import Credential, Schema, Token, TokenTypeHint
from . import replies

CONTENT_TYPE = "application/x-www-form-urlencoded"
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}  # RFC 6749 §5.1: token replies
BASIC_CHALLENGE = 'Basic realm="bedrock-price-keeper", charset="UTF-8"'
# Far above the parameters of any request here; a longer form is refused before it is parsed.
MAX_FORM_FIELDS = 20
# A value outside the few these parameters take has an error code of its own.
UNSUPPORTED = {"grant_type": "unsupported_grant_type", "token_type_hint": "unsupported_token_type"}


# --- errors (RFC 6749 §5.2) -------------------------------------------------------------


def oauth_error(
    status: int, code: str, description: str, details: dict | None = None, headers: dict | None = None
) -> ApiError:
    return ApiError(status, code, description, details, headers, error_description=description)


def invalid_request(description: str) -> ApiError:
    return oauth_error(400, "invalid_request", description)


def invalid_client(description: str) -> ApiError:
    return oauth_error(401, "invalid_client", description, headers={"WWW-Authenticate": BASIC_CHALLENGE})


def invalid_grant(description: str) -> ApiError:
    return oauth_error(400, "invalid_grant", description)


@contextmanager
def _refused_as(status: int, error: Callable[[str], ApiError]) -> Iterator[None]:
    """A refusal with ``status`` by the JSON API's logic becomes ``error``, same message."""
    try:
        yield
    except ApiError as refusal:
        if refusal.status != status:
            raise
        raise error(refusal.message) from None


# --- the request bodies: JSON (``lambdas/auth_*``) and OAuth2 forms ------------------------
# The forms' docstrings and descriptions are the OpenAPI document's.


class FormBody(Schema):
    """Base of the OAuth2 form bodies: strings only, unrecognized parameters ignored (RFC 6749
    §3.2), and the client's credentials when it authenticates in the body."""

    model_config = ConfigDict(extra="ignore", strict=True)

    client_id: Credential | None = Field(
        None,
        description="client_secret_post: the client's id. Beside HTTP Basic (client_secret_basic) it may only "
        "repeat the Basic client's id.",
    )
    client_secret: Credential | None = Field(
        None,
        description="client_secret_post: the client's secret. Never with HTTP Basic: one client authentication "
        "method per request (RFC 6749 §2.3).",
    )


class TokenForm(FormBody):
    """The client credentials grant as an OAuth2 form (RFC 6749 §4.4): the client authenticates
    with HTTP Basic or with client_id and client_secret."""

    grant_type: Literal["client_credentials"]


class RefreshForm(FormBody):
    """Refreshing as an OAuth2 form (RFC 6749 §6): the client authenticates, and the refresh
    token must be its own."""

    grant_type: Literal["refresh_token"]
    refresh_token: Token


class RevokeForm(FormBody):
    """Revocation as an OAuth2 form (RFC 7009): the client authenticates instead of showing a
    bearer token. 200, also for an invalid token; 400 invalid_grant for another client's."""

    token: Token
    token_type_hint: TokenTypeHint = None


# --- the form's client credentials ---------------------------------------------------------


def parse_form(body: str) -> dict[str, str]:
    """A form body as RFC 6749 §3.2 reads it: each parameter at most once, an empty one as
    if it were omitted."""
    try:
        pairs = parse_qsl(body, keep_blank_values=True, errors="strict", max_num_fields=MAX_FORM_FIELDS)
    except ValueError:  # percent-encoded bytes that are not UTF-8, or too many parameters
        raise invalid_request(f"Request body is not a form of at most {MAX_FORM_FIELDS} UTF-8 parameters") from None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise invalid_request("A parameter appears more than once")
    return {name: value for name, value in pairs if value}


def _validated(model: type[FormBody], params: dict[str, str]) -> FormBody:
    try:
        return model.model_validate(params)
    except ValidationError as error:
        errors = error.errors()
    unsupported = [
        UNSUPPORTED[err["loc"][0]] for err in errors if err["type"] == "literal_error" and err["loc"][0] in UNSUPPORTED
    ]
    description = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in errors)
    raise oauth_error(
        400, unsupported[0] if unsupported else "invalid_request", description, {"errors": validation_details(errors)}
    )


def basic_credentials(authorization: str) -> tuple[str, str]:
    """Client id and secret from ``Authorization: Basic`` (RFC 7617).

    RFC 6749 §2.3.1 form-encodes both before Basic; most clients (requests, curl, Authlib)
    send them as they are. Percent-decoding alone reads either right: the ids and secrets
    of this service (``org-…``, base64) hold no ``%`` and no space, so a ``+`` is a ``+``.
    """
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        raise invalid_client("Client authentication must be HTTP Basic, or client_id and client_secret in the body")
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        client_id, colon, client_secret = (unquote(part, errors="strict") for part in decoded.partition(":"))
    except ValueError:  # not base64, not UTF-8
        raise invalid_request("Malformed HTTP Basic credentials") from None
    if not colon:
        raise invalid_request("Malformed HTTP Basic credentials: no colon between client id and secret")
    return client_id, client_secret


def client_credentials(authorization: str | None, form: FormBody) -> tuple[str, str]:
    """The client's id and secret, presented with exactly one method (RFC 6749 §2.3)."""
    if authorization is None:
        if form.client_id is None or form.client_secret is None:
            raise invalid_client(
                "Client authentication required: HTTP Basic, or client_id and client_secret in the body"
            )
        return form.client_id, form.client_secret
    if form.client_secret is not None:
        raise invalid_request("More than one client authentication method: HTTP Basic and client_secret in the body")
    client_id, client_secret = basic_credentials(authorization)
    if form.client_id is not None and form.client_id != client_id:
        raise invalid_request("client_id in the body is not the client of the HTTP Basic credentials")
    return client_id, client_secret


# --- the endpoints ----------------------------------------------------------------------


def _issue(_route: Route, _form: TokenForm, client: auth.Authenticated) -> dict:
    return auth.grant_tokens(client)


def _refresh(_route: Route, form: RefreshForm, client: auth.Authenticated) -> dict:
    with _refused_as(401, invalid_grant):  # invalid, expired, revoked or another client's (§5.2)
        return auth.refresh_access_token(form.refresh_token, client=client.principal)


def _revoke(route: Route, form: RevokeForm, client: auth.Authenticated) -> dict:
    principal, org_limit = client.principal, None  # counted as the pipeline counts JSON ones: on the org's limit
    if ratelimit.enabled():
        org_limit = orgs.effective_config(principal.org_id, principal.app_id).rate_limits.get(route.rate_limit)
    ratelimit.consume(principal.client_id, limit_name=route.rate_limit, requests=org_limit)
    with _refused_as(403, invalid_grant):  # another client's token (RFC 7009 §2.1)
        auth.revoke(client.principal, form.token, ignore_invalid=True)
    return {}


class Endpoint(NamedTuple):
    form: type[FormBody]
    answer: Callable[[Route, FormBody, auth.Authenticated], dict]
    reply: type[replies.Reply]  # the 200's model: the JSON request's, or RFC 7009's empty one


ENDPOINTS: dict[str, Endpoint] = {
    routes.AUTH_TOKEN: Endpoint(TokenForm, _issue, replies.Tokens),
    routes.AUTH_REFRESH: Endpoint(RefreshForm, _refresh, replies.RefreshedToken),
    routes.AUTH_REVOKE: Endpoint(RevokeForm, _revoke, replies.Revoked),
}


def accepts(route: Route | None) -> bool:
    return route is not None and route.path in ENDPOINTS


def answer(route: Route, request: BaseProxyEvent, source_ip: str) -> tuple[int, dict, dict]:
    """Status, JSON body and headers of the answer to a form request to ``route`` (``ApiError``
    when refused). The form is checked before the client's secret (a bcrypt check)."""
    endpoint = ENDPOINTS[route.path]
    try:
        body = request.decoded_body or ""
    except ValueError:  # a base64 body that is not, or not UTF-8
        raise invalid_request("Request body is not a form of UTF-8 parameters") from None
    form = _validated(endpoint.form, parse_form(body))
    client_id, client_secret = client_credentials(request.get_header_value("Authorization"), form)
    with _refused_as(401, invalid_client):
        client = auth.authenticate_client(client_id, client_secret, source_ip=source_ip)
    return 200, replies.published(endpoint.reply, endpoint.answer(route, form, client)), NO_STORE
