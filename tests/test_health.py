from tests.conftest import assert_error


def test_root_describes_the_service(api):
    reply = api.get("/")
    assert reply.status == 200
    body = reply.json()
    assert body["service"] == "bedrock-price-keeper"
    assert body["endpoints"]["authentication"] == "/auth/token"


def test_health_reports_database_latency(api):
    reply = api.get("/health")
    assert reply.status == 200, reply
    body = reply.json()
    assert body["status"] == "healthy"
    assert body["database"]["status"] == "connected"
    assert isinstance(body["database"]["latency_ms"], int)


def test_health_is_503_when_the_store_is_gone(api, monkeypatch):
    monkeypatch.setenv("CONFIG_TABLE", "no-such-table")
    reply = api.get("/health")
    assert reply.status == 503
    assert reply.json()["status"] == "unhealthy"


def test_unknown_route_is_404_in_the_error_schema(api):
    assert_error(api.get("/api/v1/nothing-here"), 404, "NOT_FOUND")


def test_multipart_body_without_boundary_is_400_not_500(api):
    """Found by schemathesis against the local server: Powertools' form parser raised."""
    reply = api.post("/auth/token", '{"client_id": "x"}', headers={"Content-Type": "multipart/form-data"})
    assert_error(reply, 400, "INVALID_REQUEST")
