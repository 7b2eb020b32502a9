"""POST .../credentials/rotate for an org or an app (X-API-Key): a new client secret,
the old one valid for ``grace_period_hours`` (0-168, default 168), and the tokens it
obtained ending with it."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import provisioning
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()
ANSWER = documented(200, replies.RotatedCredentials, "The new secret, and until when the old one works")
RotateBody = Annotated[bodies.RotateRequest | None, Body()]


def _rotate(org_id: str, app_id: str | None, body: bodies.RotateRequest | None):
    grace = (body or bodies.RotateRequest()).grace_period_hours
    return reply(200, replies.RotatedCredentials, provisioning.rotate_credentials(org_id, app_id, grace))


@router.post(routes.rule(routes.ORG_ROTATE), responses=ANSWER)
def rotate_org_credentials(org_id: str, body: RotateBody = None):
    return _rotate(org_id, None, body)


@router.post(routes.rule(routes.APP_ROTATE), responses=ANSWER)
def rotate_app_credentials(org_id: str, app_id: str, body: RotateBody = None):
    return _rotate(org_id, app_id, body)


app = build_app(router)
lambda_handler = lambda_entry(app)
