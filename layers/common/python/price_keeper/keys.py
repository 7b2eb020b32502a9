"""Key builders, exactly as the schema seed spells them.

Ids that reach these functions have been validated (``validation.py``): an org id is a
UUID and app ids / labels cannot contain ``#``, so no id can address another tenant's keys.
"""
from __future__ import annotations

import hashlib

ROOT_RESOURCE = "#"


def org_key(org_id: str) -> str:
    return f"ORG#{org_id}"


def app_resource(app_id: str) -> str:
    return f"APP#{app_id}"


def profile_org_key(org_id: str, app_id: str) -> str:
    return f"ORG#{org_id}#APP#{app_id}"


def profile_resource(label: str) -> str:
    return f"PROFILE#{label}"


def scope_key(org_id: str, app_id: str | None, quota_scope: str) -> str:
    """``ORG#{org}`` for org-scoped quotas, ``ORG#{org}#APP#{app}`` for app-scoped ones."""
    if quota_scope == "ORG" or app_id is None:
        return org_key(org_id)
    return profile_org_key(org_id, app_id)


def day_key(day: str) -> str:
    """``DAY#yyyymmdd`` for an org-local day given as ``yyyymmdd``."""
    return f"DAY#{day}"


def usage_key(scope: str, label: str) -> str:
    return f"{scope}#LABEL#{label}"


def shard_key(scope: str, label: str, shard_id: int) -> str:
    return f"{usage_key(scope, label)}#SH#{shard_id}"


def shard_item_keys(scope: str, label: str, date_key: str, shard_count: int) -> list[dict]:
    """Keys of every usage shard item of a label on an org day (``date_key`` = ``DAY#yyyymmdd``)."""
    return [{"shard_key": shard_key(scope, label, shard), "date_key": date_key} for shard in range(shard_count)]


def usage_key_of_shard(shard: str) -> str:
    """The DailyTotal ``usage_key`` a shard key folds into."""
    return shard.rsplit("#SH#", 1)[0]


def split_usage_key(usage_key: str) -> tuple[str, str]:
    """(scope, label) of a ``{scope}#LABEL#{label}`` key."""
    scope, _, label = usage_key.rpartition("#LABEL#")
    return scope, label


def ids_of_scope(scope: str) -> tuple[str, str | None]:
    """(org_id, app_id or None) of a quota scope key."""
    org_id, _, app_id = scope.removeprefix("ORG#").partition("#APP#")
    return org_id, app_id or None


def scope_total_key(scope: str) -> str:
    """DailyTotal ``usage_key`` of a scope's total over every label (no label has ``#``,
    so it never collides with a ``{scope}#LABEL#{label}`` key)."""
    return f"{scope}#TOTAL"


def dedup_key(org_id: str, app_id: str, request_id: str) -> str:
    """Key of the per-request dedup marker stored beside the shards (see metering).

    It names the reporting app, not the quota scope, so a ``request_id`` stays a duplicate
    whatever the org's ``quota_scope`` or timezone becomes during the dedup window.
    """
    return f"{profile_org_key(org_id, app_id)}#REQ#{request_id}"


def stable_shard(request_id: str, shard_count: int) -> int:
    """Shard for a request id: the same in every process (unlike the salted ``hash()``)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count
