"""POST /auth/token: client credentials -> access token (1 h) and refresh token (7 d).

This handler answers the JSON request of api_spec.md; ``price_keeper.http.oauth`` answers the
same request as an OAuth2 form (RFC 6749), before it would reach here."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import auth
from price_keeper.http import oauth, replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply, source_ip

router = Router()


@router.post(routes.rule(routes.AUTH_TOKEN), responses=documented(200, replies.Tokens, "Access and refresh tokens"))
def issue_token(body: Annotated[bodies.TokenRequest, Body()]):
    client = auth.authenticate_client(body.client_id, body.client_secret, source_ip=source_ip(router))
    return reply(200, replies.Tokens, auth.grant_tokens(client), oauth.NO_STORE)


app = build_app(router)
lambda_handler = lambda_entry(app)
