"""POST /auth/revoke (Bearer access token of the same client): revoke an access or a
refresh token; revoking a refresh token also ends the access tokens issued from it."""
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import auth, routes
from price_keeper.api import Router, build_app, lambda_entry, principal

router = Router()


@router.post(routes.rule(routes.AUTH_REVOKE))
def revoke_token(body: Annotated[auth.RevokeRequest, Body()]):
    auth.revoke(principal(router), body.token)
    return Response(status_code=204)


app = build_app(router)
lambda_handler = lambda_entry(app)
