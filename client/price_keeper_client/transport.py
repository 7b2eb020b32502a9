"""One HTTP exchange with the service: JSON in, JSON out, typed errors for failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from ._version import __version__
from .errors import ConnectionFailed, error_from_response

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-cased names
    body: Any


class Transport:
    """Sends requests to ``base_url`` through a ``requests.Session`` (pass your own for
    proxies, TLS settings or adapters). Never logs bodies: they can carry secrets."""

    def __init__(self, base_url: str = DEFAULT_URL, *, session: requests.Session | None = None, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        all_headers = {"Accept": "application/json", "User-Agent": f"price-keeper-client/{__version__}"}
        all_headers.update(headers or {})
        try:
            response = self.session.request(
                method, self.base_url + path, json=json, params=params, headers=all_headers, timeout=self.timeout
            )
        except (requests.ConnectionError, requests.Timeout) as error:
            raise ConnectionFailed(f"{method} {path}: {type(error).__name__}") from error
        lowered = {name.lower(): value for name, value in response.headers.items()}
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
        if response.status_code >= 400:
            raise error_from_response(response.status_code, body, lowered)
        return Reply(response.status_code, lowered, body)

    def close(self) -> None:
        self.session.close()
