"""POST .../credentials/revoke-tokens for an org or an app (X-API-Key): every token issued
to the client before now is refused (204). The client secret stays valid."""

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import provisioning
from price_keeper.http.api import Router, build_app, lambda_entry

router = Router()
RevokeTokensBody = Annotated[bodies.RevokeTokensRequest | None, Body()]


def _revoke_tokens(org_id: str, app_id: str | None):
    provisioning.revoke_tokens(org_id, app_id)
    return Response(status_code=204)


@router.post(
    routes.rule(routes.ORG_REVOKE_TOKENS),
    responses={204: {"description": "Every token issued to the org's client before now is refused"}},
)
def revoke_org_tokens(org_id: str, body: RevokeTokensBody = None):
    return _revoke_tokens(org_id, None)


@router.post(
    routes.rule(routes.APP_REVOKE_TOKENS),
    responses={204: {"description": "Every token issued to the app's client before now is refused"}},
)
def revoke_app_tokens(org_id: str, app_id: str, body: RevokeTokensBody = None):
    return _revoke_tokens(org_id, app_id)


app = build_app(router)
lambda_handler = lambda_entry(app)
