"""The local server serves API requests of different functions at once (outside review,
round three, L3: a 100-record batch that settled reservations held ``/health`` for 2.91 s,
the likely cause of the connection resets seen under 16 concurrent clients), each function
one request at a time, as a Lambda container does, without one reading another's request."""

from __future__ import annotations

import json
import threading

from local import gateway
from price_keeper.http import service
from tests.usage_support import new_tenant, usage_body


def test_a_request_in_flight_holds_up_no_other_functions_request_nor_crosses_it(aws, monkeypatch):
    tenant = new_tenant()
    in_health, released, replies = threading.Event(), threading.Event(), {}
    healthy = service.health

    def health_held_until_released():
        in_health.set()
        replies["released"] = released.wait(timeout=15)  # False: the other request waited on this one
        return healthy()

    monkeypatch.setattr(service, "health", health_held_until_released)
    held = threading.Thread(target=lambda: replies.update(health=gateway.invoke("GET", "/health")))
    held.start()
    assert in_health.wait(timeout=15)
    body = usage_body()
    usage = gateway.invoke(
        "POST",
        f"/api/v1/orgs/{tenant.org_id}/apps/{tenant.app_id}/usage",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {tenant.token}", "Content-Type": "application/json"},
    )
    released.set()
    held.join(timeout=30)
    assert replies["released"] is True, "the usage report waited for /health to finish"
    assert usage["statusCode"] == 202 and json.loads(usage["body"])["request_id"] == body["request_id"]
    health = replies["health"]
    assert health["statusCode"] == 200 and "status" in json.loads(health["body"])
