"""Validation of ids that become part of DynamoDB keys, and other shared input rules."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

# app ids and profile labels: no '#', so no id can reach into another tenant's keys.
APP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_APP_ID = re.compile(APP_ID_PATTERN)
REGION_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-\d$"
_REGION = re.compile(REGION_PATTERN)


def is_uuid(value: str) -> bool:
    """A UUID in its canonical lower-case 36-character form, so one org cannot have two keys."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value  # lower-case only: one org, one key
    except ValueError:
        return False


def is_app_id(value: str) -> bool:
    return isinstance(value, str) and _APP_ID.fullmatch(value) is not None


is_label = is_app_id


def is_region(value: str) -> bool:
    return isinstance(value, str) and _REGION.fullmatch(value) is not None


class Schema(BaseModel):
    """Base of the request and reply shapes. ``defer_build``: pydantic builds a model's
    validator when it is first used, not at import, so a function does not pay at cold
    start for the shapes of the other functions that share its modules (~2 ms each)."""

    model_config = ConfigDict(defer_build=True)


class StrictBody(Schema):
    """Base of request bodies: JSON types exactly (``"5"`` is not 5, ``1`` is not ``true``)
    and no unknown fields, so a misspelt setting is a 400 instead of silently ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)


# The token endpoints' fields, JSON (``bodies``) or OAuth2 forms (``http.oauth``): far above any
# id or token this service issues, so longer input is refused before any work.
Credential = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Token = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
TokenTypeHint = Literal["access_token", "refresh_token"] | None
