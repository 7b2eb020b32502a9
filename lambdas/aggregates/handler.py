"""GET .../aggregates/today and .../aggregates/{date} (Bearer), for an org (org token) and
for an app (its token or the org's): the day's spend per label against its quota."""

from price_keeper import routes
from price_keeper.domain import aggregates
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()
ANSWER = documented(200, replies.Aggregates, "The day's spend per label")


def _answer(org_id: str, app_id: str | None, date: str | None):
    body, headers = aggregates.daily_aggregates(org_id, app_id, date)
    return reply(200, replies.Aggregates, body, headers)


# The literal ``today`` routes are registered before the ``{date}`` ones they would match.
@router.get(routes.rule(routes.ORG_AGGREGATES_TODAY), responses=ANSWER)
def org_today(org_id: str):
    return _answer(org_id, None, None)


@router.get(routes.rule(routes.APP_AGGREGATES_TODAY), responses=ANSWER)
def app_today(org_id: str, app_id: str):
    return _answer(org_id, app_id, None)


@router.get(routes.rule(routes.ORG_AGGREGATES_DATE), responses=ANSWER)
def org_date(org_id: str, date: str):
    return _answer(org_id, None, date)


@router.get(routes.rule(routes.APP_AGGREGATES_DATE), responses=ANSWER)
def app_date(org_id: str, app_id: str, date: str):
    return _answer(org_id, app_id, date)


app = build_app(router)
lambda_handler = lambda_entry(app)
