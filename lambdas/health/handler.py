"""GET / and GET /health (public)."""

from price_keeper import routes
from price_keeper.http import replies, service
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.get(routes.rule(routes.ROOT), responses=documented(200, replies.ServiceInfo, "Service information"))
def root():
    return reply(200, replies.ServiceInfo, service.info())


@router.get(
    routes.rule(routes.HEALTH),
    responses=documented(200, replies.Health, "Healthy")
    | documented(503, replies.Health, "Unhealthy: the store does not answer"),
)
def health():
    healthy, body = service.health()
    return reply(200 if healthy else 503, replies.Health, body)


app = build_app(router)
lambda_handler = lambda_entry(app)
