"""EventBridge: the service's alert events, on its bus."""

from __future__ import annotations

import json
import os

from botocore.exceptions import BotoCoreError, ClientError

from . import client

EVENT_SOURCE = "price-keeper"
DETAIL_TYPE = "SpendAlert"
DEFAULT_EVENT_BUS = "price-keeper-events"


def event_bus() -> str:
    """``ALERT_EVENT_BUS``; the CDK stack sets ``EVENT_BUS_NAME`` on the publishing functions."""
    return os.environ.get("ALERT_EVENT_BUS") or os.environ.get("EVENT_BUS_NAME") or DEFAULT_EVENT_BUS


def put_alert(detail: dict) -> dict | None:
    """PutEvents of one alert: None when EventBridge took it, else what failed (for the log)."""
    entry = dict(Source=EVENT_SOURCE, DetailType=DETAIL_TYPE, Detail=json.dumps(detail), EventBusName=event_bus())
    try:
        reply = client("events").put_events(Entries=[{**entry, "Resources": []}])
    except (ClientError, BotoCoreError) as error:
        return {"error_type": type(error).__name__}
    if reply.get("FailedEntryCount"):
        return {"error_code": reply["Entries"][0].get("ErrorCode")}
    return None
