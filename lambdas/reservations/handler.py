"""POST and DELETE /api/v1/orgs/{org_id}/apps/{app_id}/reservations[/{reservation_id}]
(Bearer): hold a call's worst-case cost before the call (201, or 429 when no label's quota
can hold it), and give a hold back when the call never happened (204, idempotent).
A usage record carrying the ``reservation_id`` settles it."""

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import bodies, routes
from price_keeper.domain import reservations
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(routes.rule(routes.RESERVATIONS), responses=documented(201, replies.Reservation, "Held"))
def create_reservation(org_id: str, app_id: str, body: Annotated[bodies.ReservationRequest, Body()]):
    return reply(201, replies.Reservation, reservations.reserve(org_id, app_id, body))


@router.delete(
    routes.rule(routes.RESERVATION), responses={204: {"description": "Released (or already ended: idempotent)"}}
)
def release_reservation(org_id: str, app_id: str, reservation_id: str):
    reservations.release(org_id, app_id, reservation_id)
    return Response(status_code=204)


app = build_app(router)
lambda_handler = lambda_entry(app)
