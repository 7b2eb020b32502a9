"""PUT /api/v1/orgs/{org_id} (X-API-Key): create an org (201, one-time credentials) or update it (200)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import provisioning
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.put(
    routes.rule(routes.ORG_CONFIG),
    responses=documented(200, replies.OrgUpdated, "Updated")
    | documented(201, replies.OrgCreated, "Created, with the one-time client credentials"),
)
def put_org(org_id: str, body: Annotated[bodies.OrgRequest, Body()]):
    created, body = provisioning.put_org(org_id, body)
    return reply(201, replies.OrgCreated, body) if created else reply(200, replies.OrgUpdated, body)


app = build_app(router)
lambda_handler = lambda_entry(app)
