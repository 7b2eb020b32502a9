"""PUT /api/v1/orgs/{org_id} (X-API-Key): create an org (201, one-time credentials) or update it (200)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import routes
from price_keeper.domain import provisioning
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.put(
    routes.rule(routes.ORG_CONFIG),
    responses={200: {"description": "Updated"}, 201: {"description": "Created, with the one-time client credentials"}},
)
def put_org(org_id: str, body: Annotated[provisioning.OrgRequest, Body()]):
    created, reply = provisioning.put_org(org_id, body)
    return json_response(201 if created else 200, reply)


app = build_app(router)
lambda_handler = lambda_entry(app)
