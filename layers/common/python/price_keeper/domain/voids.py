"""Voiding usage reported in error: an operator's ``POST .../usage/void`` (X-API-Key).

A void marks the record's dedup marker voided, exactly once (conditional on it existing, not
voided, and the cost read, so a re-pricing in between makes it read again); the aggregator
then takes the record's counts back (``ledger.counted``), and a settled reservation gets its
room back in the same transaction. The marker stays, so a retry of the request id is still a
duplicate; records past the dedup window are ``not_found``.
"""

from __future__ import annotations

from datetime import datetime

from .. import audit
from ..bodies import VoidRequest
from ..errors import service_unavailable
from ..store import keys, usage
from ..timeutil import iso_utc, retry_pause, utc_now
from . import orgs, reservations

TRANSACTION_ATTEMPTS = 5


def _result(request_id: str, status: str, marker: dict | None = None) -> dict:
    marker = marker or {}
    return {
        "request_id": request_id,
        "status": status,
        "model_label": marker.get("model_label"),
        "org_day": marker.get("org_day"),
        "cost_usd_micros": int(marker["cost_usd_micros"]) if "cost_usd_micros" in marker else None,
    }


def _void_one(config: orgs.EffectiveConfig, request_id: str, reason: str, now_epoch: int) -> dict:
    marker_key = keys.marker_key(config.org_id, config.app_id, request_id, config.agg_shard_count)
    for attempt in range(TRANSACTION_ATTEMPTS):
        marker = usage.read_marker(marker_key)
        if marker is None:
            return _result(request_id, "not_found")
        if "voided_at_epoch" in marker:
            return _result(request_id, "already_voided", marker)
        items = [usage.void_mark(marker_key, marker, now_epoch, reason)]
        if usage.SETTLED in marker:  # it settled a reservation: its ledgers give the room back
            items += reservations.void_actions(
                list(marker["scopes"]), marker["model_label"], marker["org_day"], int(marker[usage.SETTLED])
            )
        try:
            first = usage.write_once(items, attempt)
        except usage.Conflict:
            retry_pause(attempt)
            continue
        if first is None:
            return _result(request_id, "voided", marker)
        if first and "voided_at_epoch" not in first:
            continue  # re-priced since it was read: take back what it counts now
        return _result(request_id, "already_voided" if first else "not_found", first)
    raise service_unavailable("Void kept conflicting with concurrent writes; retry")


def void(org_id: str, request: VoidRequest, now: datetime | None = None) -> dict:
    """``POST .../usage/void``: void each record once; 404 for an unknown org or app."""
    now = now or utc_now()
    config = orgs.effective_config(org_id, request.app_id)
    audit.note(app_id=request.app_id, reason=request.reason, request_ids=len(request.request_ids))
    results = [
        _void_one(config, request_id, request.reason, int(now.timestamp())) for request_id in request.request_ids
    ]
    voided = [result for result in results if result["status"] == "voided"]
    audit.note(voided=[result["request_id"] for result in voided])
    return {
        "org_id": org_id,
        "app_id": request.app_id,
        "voided": len(voided),
        "voided_cost_usd_micros": sum(result["cost_usd_micros"] for result in voided),
        "results": results,
        "timestamp": iso_utc(now),
    }
