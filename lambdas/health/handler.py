"""GET / and GET /health (public)."""

from price_keeper import routes
from price_keeper.domain import service
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.get(routes.rule(routes.ROOT))
def root():
    return json_response(200, service.info())


@router.get(routes.rule(routes.HEALTH))
def health():
    healthy, body = service.health()
    return json_response(200 if healthy else 503, body)


app = build_app(router)
lambda_handler = lambda_entry(app)
