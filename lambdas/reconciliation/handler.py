"""GET /api/v1/reconciliation?date=YYYY-MM-DD&page=N (X-API-Key): a UTC day's latest
reconciliation of Bedrock's own counts with the metered ones, per model (default: today),
a page of 500 models at a time."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from price_keeper import routes
from price_keeper.domain import reconciliation
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.get(routes.rule(routes.RECONCILIATION), responses=documented(200, replies.Reconciliation, "The day's result"))
def get_reconciliation(
    date: Annotated[str | None, Query(description="UTC day, YYYY-MM-DD; default today")] = None,
    page: Annotated[int, Query(ge=0, description="Page of the day's models, from 0 (500 a page)")] = 0,
):
    return reply(200, replies.Reconciliation, reconciliation.stored(date, page))


app = build_app(router)
lambda_handler = lambda_entry(app)
