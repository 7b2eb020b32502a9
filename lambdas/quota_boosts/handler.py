"""POST /api/v1/orgs/{org_id}/quota-boosts (X-API-Key): add micro-USD to one label's daily
quota until an expiry at most 7 days ahead (201 with the stored boost)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import boosts
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(
    routes.rule(routes.QUOTA_BOOSTS),
    responses=documented(201, replies.Boost, "Boost stored"),
)
def create_quota_boost(org_id: str, body: Annotated[bodies.BoostRequest, Body()]):
    return reply(201, replies.Boost, boosts.create(org_id, body))


app = build_app(router)
lambda_handler = lambda_entry(app)
