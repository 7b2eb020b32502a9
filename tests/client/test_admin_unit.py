"""The admin client's reading of a paged answer: ``Provisioning.reconciliation`` asks for
every page of the day and joins their models (the service answers 500 a page)."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import requests
from requests.adapters import BaseAdapter

from price_keeper_client.admin import Provisioning


class PagedReconciliation(BaseAdapter):
    """Answers ``GET /api/v1/reconciliation`` as the service does for a day of ``models``."""

    PAGE = 500

    def __init__(self, models: list[dict]):
        super().__init__()
        self.models, self.asked = models, []

    def send(self, request, **_):
        query = parse_qs(urlsplit(request.url).query)
        page = int(query.get("page", ["0"])[0])
        self.asked.append((query.get("date", [None])[0], page, request.headers["X-API-Key"]))
        pages = -(-len(self.models) // self.PAGE)
        body = {
            "date": "2026-11-20",
            "region": "us-east-1",
            "models": self.models[page * self.PAGE : (page + 1) * self.PAGE],
            "page": page,
            "pages": pages,
        }
        reply = requests.Response()
        reply.status_code, reply._content = 200, json.dumps(body).encode()
        reply.headers["Content-Type"] = "application/json"
        reply.url, reply.request = request.url, request
        return reply

    def close(self):
        pass


def admin_of(adapter: PagedReconciliation) -> Provisioning:
    session = requests.Session()
    session.mount("http://", adapter)
    return Provisioning("http://service.test", "key", session=session)


def test_every_page_of_the_day_is_read_and_joined():
    models = [{"model_id": f"profile-{n:04d}"} for n in range(1_200)]
    adapter = PagedReconciliation(models)
    result = admin_of(adapter).reconciliation("2026-11-20")
    assert result["models"] == models and result["pages"] == 3
    assert adapter.asked == [("2026-11-20", 0, "key"), ("2026-11-20", 1, "key"), ("2026-11-20", 2, "key")]


def test_a_day_of_one_page_or_none_is_one_request():
    for models in ([{"model_id": "amazon.nova-pro-v1:0"}], []):
        adapter = PagedReconciliation(models)
        assert admin_of(adapter).reconciliation()["models"] == models
        assert adapter.asked == [(None, 0, "key")]
