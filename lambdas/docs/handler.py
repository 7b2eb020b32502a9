"""GET /openapi.json, GET /docs and GET /console: the OpenAPI document of the whole API, a
Swagger UI, and the spend console (a static page from the layer, ``price_keeper.console``).

The document is generated from the routers (and pydantic models) of every HTTP function,
so it cannot drift from the handlers; the function's code asset is therefore the whole
``lambdas/`` directory.
"""
from functools import lru_cache
from pathlib import Path

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

from price_keeper import console, openapi, routes
from price_keeper.api import Router, build_app, dumps, lambda_entry
from price_keeper.config import get_config
from price_keeper.modules import load_handler_module

LAMBDAS_DIR = Path(__file__).resolve().parent.parent
SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5"

router = Router()


@lru_cache(maxsize=1)
def _document() -> str:
    modules = [load_handler_module(LAMBDAS_DIR, name) for name in routes.HTTP_FUNCTIONS
               if name != "docs" and (LAMBDAS_DIR / name / "handler.py").exists()]
    api = build_app(*(module.router for module in modules))
    try:
        return dumps(openapi.document(api, get_config().version))
    finally:
        # Including a router hands its request state (event, context: the principal) to the
        # including app. Where the functions share a process (the local server, the tests),
        # give each router back to its own function's app.
        for module in modules:
            module.router.api_resolver = module.app


@router.get(routes.rule(routes.OPENAPI), include_in_schema=False)
def openapi_document():
    return Response(200, "application/json", _document())


@router.get(routes.rule(routes.DOCS), include_in_schema=False)
def docs_page():
    html = generate_swagger_html(_document().replace("</", "<\\/"), f"{SWAGGER_UI}/swagger-ui-bundle.js",
                                 f"{SWAGGER_UI}/swagger-ui.css", SWAGGER_UI, None)
    return Response(200, "text/html", html)


@router.get(routes.rule(routes.CONSOLE), include_in_schema=False)
def console_page():
    page = console.page()
    return Response(200, console.CONTENT_TYPE, page.html, page.headers)


app = build_app(router)
lambda_handler = lambda_entry(app)
