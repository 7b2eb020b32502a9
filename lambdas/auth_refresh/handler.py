"""POST /auth/refresh: a refresh token -> a new access token.

This handler answers the JSON request of api_spec.md; ``price_keeper.http.oauth`` answers the
same request as an OAuth2 form (RFC 6749 §6), before it would reach here."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import auth
from price_keeper.http import oauth, replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(routes.rule(routes.AUTH_REFRESH), responses=documented(200, replies.RefreshedToken, "A new access token"))
def refresh_token(body: Annotated[bodies.RefreshRequest, Body()]):
    return reply(200, replies.RefreshedToken, auth.refresh_access_token(body.refresh_token), oauth.NO_STORE)


app = build_app(router)
lambda_handler = lambda_entry(app)
