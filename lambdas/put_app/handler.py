"""PUT /api/v1/orgs/{org_id}/apps/{app_id} (X-API-Key): create an app (201, one-time
credentials) or update it (200)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import provisioning
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.put(
    routes.rule(routes.APP_CONFIG),
    responses=documented(200, replies.AppUpdated, "Updated")
    | documented(201, replies.AppCreated, "Created, with the one-time client credentials"),
)
def put_app(org_id: str, app_id: str, body: Annotated[bodies.AppRequest, Body()]):
    created, body = provisioning.put_app(org_id, app_id, body)
    return reply(201, replies.AppCreated, body) if created else reply(200, replies.AppUpdated, body)


app = build_app(router)
lambda_handler = lambda_entry(app)
