"""GET /api/v1/orgs/{org_id}/alerts?date=YYYY-MM-DD (org token): the spend alerts fired on an
org-local day (default: today in the org's timezone)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from price_keeper import routes
from price_keeper.domain import alerts
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.get(routes.rule(routes.ALERTS), responses=documented(200, replies.AlertList, "Alerts of the day"))
def list_alerts(
    org_id: str,
    date: Annotated[str | None, Query(description="Org-local day, YYYY-MM-DD; default today")] = None,
):
    return reply(200, replies.AlertList, alerts.list_alerts(org_id, date))


app = build_app(router)
lambda_handler = lambda_entry(app)
