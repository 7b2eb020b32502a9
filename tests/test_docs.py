"""The served OpenAPI document covers every route and speaks the real error schema."""
import json
import re

from price_keeper import routes


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
