"""The served OpenAPI document covers every route and speaks the real error schema."""
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


def test_docs_page_embeds_the_document(api):
    reply = api.get("/docs")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert '"openapi":"3.1.0"' in reply.text


def test_serving_the_document_leaves_every_function_its_own_request_state(api):
    """The docs function builds the document from every function's router; where they share
    a process (the local server) the routers stay their own functions': a JSON revocation,
    which reads the principal the pipeline gave its router, still works afterwards."""
    from tests.provisioned import new_org, tokens

    _, credentials = new_org(api)
    issued = tokens(api, credentials)
    assert api.get("/openapi.json").status == 200
    reply = api.post("/auth/revoke", {"token": issued["refresh_token"]}, token=issued["access_token"])
    assert reply.status == 204, reply
