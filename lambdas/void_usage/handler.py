"""POST /api/v1/orgs/{org_id}/usage/void (X-API-Key): take usage records reported in error
back out of the day's totals, each exactly once (200 with one result per request id)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import voids
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(
    routes.rule(routes.USAGE_VOID),
    responses=documented(200, replies.VoidReply, "Records voided"),
)
def void_usage(org_id: str, body: Annotated[bodies.VoidRequest, Body()]):
    return reply(200, replies.VoidReply, voids.void(org_id, body))


app = build_app(router)
lambda_handler = lambda_entry(app)
