"""POST /api/v1/orgs/{org_id}/usage/void (X-API-Key): take usage records reported in error
back out of the day's totals, each exactly once (200 with one result per request id)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import routes
from price_keeper.domain import voids
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.post(
    routes.rule(routes.USAGE_VOID),
    responses={200: {"description": "Records voided", "content": {"application/json": {"model": voids.VoidReply}}}},
)
def void_usage(org_id: str, body: Annotated[voids.VoidRequest, Body()]):
    return json_response(200, voids.void(org_id, body))


app = build_app(router)
lambda_handler = lambda_entry(app)
