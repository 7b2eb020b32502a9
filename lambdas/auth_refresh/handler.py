"""POST /auth/refresh: a refresh token -> a new access token."""
from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import auth, replies, routes
from price_keeper.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(routes.rule(routes.AUTH_REFRESH), responses=documented(200, replies.RefreshedToken, "A new access token"))
def refresh_token(body: Annotated[auth.RefreshRequest, Body()]):
    return reply(200, replies.RefreshedToken, auth.refresh_access_token(body.refresh_token))


app = build_app(router)
lambda_handler = lambda_entry(app)
