"""POST /api/v1/orgs/{org_id}/apps/{app_id}/usage/batch (Bearer): meter 1-100 calls.

207 with a result per record; each record is validated and written on its own (and, with
``?model_selection=true``, the model selection of now).
"""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from price_keeper import routes
from price_keeper.bodies import UsageBatchRequest
from price_keeper.domain import metering
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, principal, reply

router = Router()


@router.post(
    routes.rule(routes.USAGE_BATCH), responses=documented(207, replies.BatchReceipt, "A result per record, in order")
)
def submit_usage_batch(
    org_id: str,
    app_id: str,
    body: Annotated[UsageBatchRequest, Body()],
    model_selection: Annotated[bool, Query()] = False,
):
    client = principal(router).client_id  # (its rate-limit client: records written alone are charged to it)
    receipt = metering.submit_batch(org_id, app_id, body.requests, with_selection=model_selection, client=client)
    return reply(207, replies.BatchReceipt, receipt)


app = build_app(router)
lambda_handler = lambda_entry(app)
