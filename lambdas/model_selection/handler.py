"""GET /api/v1/orgs/{org_id}/apps/{app_id}/model-selection[?force_check=true] (Bearer):
the label to call now, quota status, price and polling guidance; 429 when all are spent."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from price_keeper import routes
from price_keeper.domain import selection
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.get(
    routes.rule(routes.MODEL_SELECTION), responses=documented(200, replies.ModelSelection, "The label to call now")
)
def model_selection(org_id: str, app_id: str, force_check: Annotated[bool, Query()] = False):
    body, headers = selection.select_model(org_id, app_id, force_check=force_check)
    return reply(200, replies.ModelSelection, body, headers)


app = build_app(router)
lambda_handler = lambda_entry(app)
