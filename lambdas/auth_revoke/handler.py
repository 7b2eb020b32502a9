"""POST /auth/revoke (Bearer access token of the same client): revoke an access or a
refresh token; revoking a refresh token also ends the access tokens issued from it.

This handler answers the JSON request of api_spec.md (204); ``price_keeper.http.oauth`` answers
the same request as an OAuth2 form (RFC 7009: the client authenticates, 200), before it
would reach here."""

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import auth
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, principal

router = Router()

RESPONSES = {
    204: {"description": "Revoked (a JSON request), or already expired"},
    **documented(200, replies.Revoked, "Revoked (an OAuth2 form, RFC 7009), or no token of this service"),
}


@router.post(routes.rule(routes.AUTH_REVOKE), responses=RESPONSES)
def revoke_token(body: Annotated[bodies.RevokeRequest, Body()]):
    auth.revoke(principal(router), body.token)
    return Response(status_code=204)


app = build_app(router)
lambda_handler = lambda_entry(app)
