"""GET /api/v1/orgs/{org_id}/alerts?date=YYYY-MM-DD (org token): the spend alerts fired on an
org-local day (default: today in the org's timezone)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from price_keeper import routes
from price_keeper.domain import alerts
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.get(
    routes.rule(routes.ALERTS),
    responses={200: {"description": "Alerts of the day", "content": {"application/json": {"model": alerts.AlertList}}}},
)
def list_alerts(
    org_id: str,
    date: Annotated[str | None, Query(description="Org-local day, YYYY-MM-DD; default today")] = None,
):
    return json_response(200, alerts.list_alerts(org_id, date))


app = build_app(router)
lambda_handler = lambda_entry(app)
