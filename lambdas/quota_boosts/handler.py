"""POST /api/v1/orgs/{org_id}/quota-boosts (X-API-Key): add micro-USD to one label's daily
quota until an expiry at most 7 days ahead (201 with the stored boost)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import routes
from price_keeper.domain import boosts
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.post(
    routes.rule(routes.QUOTA_BOOSTS),
    responses={201: {"description": "Boost stored", "content": {"application/json": {"model": boosts.Boost}}}},
)
def create_quota_boost(org_id: str, body: Annotated[boosts.BoostRequest, Body()]):
    return json_response(201, boosts.create(org_id, body))


app = build_app(router)
lambda_handler = lambda_entry(app)
