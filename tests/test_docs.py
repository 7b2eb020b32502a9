"""The served OpenAPI document covers every route and speaks the real error schema."""

import json
import re

from price_keeper import routes
from tests.provisioned import new_org, tokens


def test_openapi_document_lists_every_api_route(api):
    reply = api.get("/openapi.json")
    assert reply.status == 200, reply
    paths = reply.json()["paths"]
    for route in routes.ROUTES:
        if route.function == "docs":
            continue
        assert route.method.lower() in paths.get(route.path, {}), f"{route.method} {route.path} missing"


def test_openapi_documents_400_errors_not_422(api):
    document = api.get("/openapi.json").json()
    assert "Error" in document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
            assert operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


def test_every_reference_in_the_document_resolves(api):
    text = api.get("/openapi.json").text
    schemas = json.loads(text)["components"]["schemas"]
    refs = set(re.findall(r'"\$ref":\s*"#/components/schemas/([^"]+)"', text))
    assert refs and refs <= set(schemas), sorted(refs - set(schemas))


def test_docs_page_embeds_the_document(api):
    reply = api.get("/docs")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert '"openapi":"3.1.0"' in reply.text
    assert "SwaggerUIBundle" in reply.text  # Swagger UI's script inline: no script or stylesheet to fetch
    assert not re.search(r"<(?:script|link)\b[^>]*\b(?:src|href)=", reply.text)


def test_docs_page_link_to_its_document_answers_the_document(api):
    reply = api.get("/docs", query="format=json")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    assert reply.json() == api.get("/openapi.json").json()


def test_the_functions_keep_their_callers_once_the_document_is_built(api):
    """The document's app includes copies of the handlers' routers: including the serving ones
    would make it their resolver, and /auth/revoke, in the same process, would lose its caller."""
    assert api.get("/openapi.json").status == 200
    _, credentials = new_org(api)
    issued = tokens(api, credentials)
    revoked = api.post("/auth/revoke", {"token": issued["refresh_token"]}, token=issued["access_token"])
    assert revoked.status == 204, revoked
