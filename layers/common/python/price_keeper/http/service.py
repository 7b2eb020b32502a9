"""Service information and the health probe: the replies of GET / and GET /health."""

from __future__ import annotations

import time

from ..config import get_config
from ..store import config_items
from ..timeutil import iso_utc, utc_now


def _service() -> dict:
    config = get_config()
    return {"service": config.service_name, "version": config.version}


def info() -> dict:
    return {
        **_service(),
        "description": "Bedrock model cost tracking and intelligent model selection service",
        "documentation": "/docs",
        "endpoints": {"authentication": "/auth/token", "health": "/health", "api": "/api/v1"},
    }


def health() -> tuple[bool, dict]:
    """(healthy, body): one eventually consistent GetItem proves the store answers."""
    body = {"status": "healthy", **_service(), "timestamp": iso_utc(utc_now())}
    started = time.perf_counter()
    try:
        config_items.probe()
    except Exception as error:  # any failure to reach the store is "unhealthy", not a 500
        body.update(status="unhealthy", database={"status": "disconnected", "error": type(error).__name__})
        return False, body
    body["database"] = {"status": "connected", "latency_ms": round((time.perf_counter() - started) * 1000)}
    return True, body
