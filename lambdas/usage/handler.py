"""POST /api/v1/orgs/{org_id}/apps/{app_id}/usage (Bearer): meter one Bedrock call.

202 with the shard, the server-computed cost and the label's current DailyTotal (and, with
``?model_selection=true``, the model selection of now); the same ``request_id`` again is a
no-op answered with the original outcome.
"""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from price_keeper import routes
from price_keeper.bodies import UsageRequest
from price_keeper.domain import metering
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(routes.rule(routes.USAGE), responses=documented(202, replies.UsageReceipt, "Counted (or a duplicate)"))
def submit_usage(
    org_id: str, app_id: str, body: Annotated[UsageRequest, Body()], model_selection: Annotated[bool, Query()] = False
):
    receipt = metering.submit(org_id, app_id, body, with_selection=model_selection)
    return reply(202, replies.UsageReceipt, receipt)


app = build_app(router)
lambda_handler = lambda_entry(app)
