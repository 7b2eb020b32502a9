"""GET /openapi.json, GET /docs and GET /console: the OpenAPI document of the whole API, a
Swagger UI, and the spend console (a static page from the layer, ``price_keeper.http.console``).

The document is generated from the routers (and pydantic models) of every HTTP function,
so it cannot drift from the handlers; the function's code asset is therefore the whole
``lambdas/`` directory.

The Swagger UI page is one self-contained response: Swagger UI's script and stylesheet are
the copies Powertools ships (in the managed layer too), inlined as Powertools' own
``enable_swagger`` does without a ``swagger_base_url``, so the page loads no CDN and works
offline.
"""

from functools import lru_cache
from pathlib import Path

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi import swagger_ui
from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

from price_keeper import routes
from price_keeper.config import get_config
from price_keeper.http import console, openapi
from price_keeper.http.api import Router, build_app, dumps, lambda_entry
from price_keeper.http.modules import load_handler_module

LAMBDAS_DIR = Path(__file__).resolve().parent.parent
SWAGGER_UI = Path(swagger_ui.__file__).resolve().parent

router = Router()


@lru_cache(maxsize=4)
def _document(base_path: str) -> str:
    """The document with ``base_path``, the stage the request came through, as its server."""
    # From copies of the handlers: an app that includes a router becomes the router's resolver
    # (its request context), so in one process (the local server, the tests) the serving
    # functions would read this app's empty context, and their callers would be lost.
    functions = [name for name in routes.HTTP_FUNCTIONS if name != "docs"]
    api = build_app(
        *(
            load_handler_module(LAMBDAS_DIR, name, namespace="docs").router
            for name in functions
            if (LAMBDAS_DIR / name / "handler.py").exists()
        )
    )
    return dumps(openapi.document(api, get_config().version, base_path))


@router.get(routes.rule(routes.OPENAPI), include_in_schema=False)
def openapi_document():
    return Response(200, "application/json", _document(app.base_path()))


@lru_cache(maxsize=4)
def _docs_html(base_path: str) -> str:
    script, style = (
        (SWAGGER_UI / name).read_text(encoding="utf-8") for name in ("swagger-ui-bundle.min.js", "swagger-ui.min.css")
    )
    return generate_swagger_html(_document(base_path).replace("</", "<\\/"), script, style, "", None)


@router.get(routes.rule(routes.DOCS), include_in_schema=False)
def docs_page():
    if router.current_event.get_query_string_value("format") == "json":  # the link Swagger UI shows
        return openapi_document()
    return Response(200, "text/html; charset=utf-8", _docs_html(app.base_path()))


@router.get(routes.rule(routes.CONSOLE), include_in_schema=False)
def console_page():
    page = console.page()
    return Response(200, console.CONTENT_TYPE, page.html, page.headers)


app = build_app(router)
lambda_handler = lambda_entry(app)
