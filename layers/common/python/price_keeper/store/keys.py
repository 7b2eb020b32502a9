"""Every key of every table, built and parsed here, exactly as the schema seed spells them.

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


def app_id_of_resource(resource_key: str) -> str:
    """The app id of an ``APP#{app}`` Config resource key."""
    return resource_key.removeprefix(app_resource(""))


HEALTH_PROBE = {"org_key": "HEALTH", "resource_key": ROOT_RESOURCE}  # never written: a read proves the store answers


def profile_org_key(org_id: str, app_id: str) -> str:
    return f"ORG#{org_id}#APP#{app_id}"


def profile_resource(label: str) -> str:
    return f"PROFILE#{label}"


def profile_label_of_resource(resource_key: str) -> str:
    return resource_key.removeprefix(profile_resource(""))


BOOST_PREFIX = "BOOST#"


def boost_prefix(quota_scope: str, app_id: str | None) -> str:
    """``BOOST#ORG#`` or ``BOOST#APP#{app_id}#``: the Config resource_key prefix of one quota's boosts."""
    return f"{BOOST_PREFIX}ORG#" if quota_scope == "ORG" else f"{BOOST_PREFIX}APP#{app_id}#"


def scope_key(org_id: str, app_id: str | None, quota_scope: str) -> str:
    """``ORG#{org}`` for org-scoped quotas, ``ORG#{org}#APP#{app}`` for app-scoped ones."""
    if quota_scope == "ORG" or app_id is None:
        return org_key(org_id)
    return profile_org_key(org_id, app_id)


def split_scope(scope: str) -> tuple[str, str | None]:
    """(org id, app id or None) of a scope key."""
    org_id, _, app_id = scope.removeprefix(org_key("")).partition("#APP#")
    return org_id, app_id or None


def day_key(day: str) -> str:
    """``DAY#yyyymmdd`` for an org-local day given as ``yyyymmdd``."""
    return f"DAY#{day}"


def day_of_key(date_key: str) -> str:
    """``yyyymmdd`` of a ``DAY#yyyymmdd`` key."""
    return date_key.removeprefix(day_key(""))


# A ledger label-day's live items: each tight record ADDs to one, by its dedup key, so the
# transactions of a hot label in tight mode rarely meet on one item; tight mode reads them all.
LIVE_PARTS = 8


def live_day_key(day: str, part: int) -> str:
    """``LIVE#yyyymmdd#{part}``: one of a ledger label-day's live items (``LIVE_PARTS``), its
    tight records not folded yet (``domain.ledger``), beside the ``DAY#`` total."""
    return f"LIVE#{day}#{part}"


def live_part(marker_key: dict) -> int:
    """The live item a record of ``marker_key`` goes on: the same for its write and its fold."""
    return stable_shard(marker_key["date_key"], LIVE_PARTS)


def ledger_day_key(day: str) -> str:
    """``LEDGER#yyyymmdd``: the reservation ledger of a DailyTotal's org day, an item of its
    own beside the ``DAY#`` total (``store.reservations``)."""
    return f"LEDGER#{day}"


# The ``active-by-day`` index's partition keys per org day: an org's label-days index under
# one of 16 (by org), so the new label-days of a day's start (every org of a timezone at once)
# spread their index writes over 16 partitions instead of one, and the audit pages them at once.
ACTIVE_DAY_BUCKETS = 16


def active_day_key(day: str, org_id: str) -> str:
    """``DAY#yyyymmdd#{bucket}``: what a label-day of ``org_id`` on org day ``day`` is indexed under."""
    return f"{day_key(day)}#{stable_shard(org_id, ACTIVE_DAY_BUCKETS):02d}"


def active_day_keys(day: str) -> list[str]:
    """Every index partition key of org day ``day``."""
    return [f"{day_key(day)}#{bucket:02d}" for bucket in range(ACTIVE_DAY_BUCKETS)]


def usage_key(scope: str, label: str) -> str:
    return f"{scope}#LABEL#{label}"


def day_entry_key(scope: str, label: str, day: str) -> dict:
    """A label-day's entry in UsageAggSharded's ``active-by-day`` index (``usage.day_listed``):
    ``{scope}#LABEL#{label}`` / ``DAY#yyyymmdd``, no counters."""
    return {"shard_key": usage_key(scope, label), "date_key": day_key(day)}


def split_usage_key(usage_key: str) -> tuple[str, str]:
    """(scope, label) of a ``{scope}#LABEL#{label}`` key."""
    scope, _, label = usage_key.rpartition("#LABEL#")
    return scope, label


def grace_key(usage_key: str, day: str) -> dict:
    """The DailyTotal item of what a label total's or scope total's closed org day
    ``yyyymmdd`` has left for the records booked to it in the grace after its midnight
    (``domain.metering``)."""
    return {"usage_key": usage_key, "date_key": f"GRACE#{day}"}


def scope_total_key(scope: str) -> str:
    """DailyTotal ``usage_key`` of a scope's total over every label (no label has ``#``,
    so it never collides with a ``{scope}#LABEL#{label}`` key)."""
    return f"{scope}#TOTAL"


def spent_labels_key(scope: str) -> str:
    """DailyTotal ``usage_key`` of the labels a scope spent on: an item a label-day,
    ``spent_label_key``, so the scope total stays a few hundred bytes however many there are."""
    return f"{scope}#LABELS"


def spent_label_key(scope: str, date_key: str, label: str) -> dict:
    """The item saying ``scope`` spent on ``label`` on the org day of ``date_key``
    (``DAY#yyyymmdd#{label}``: a scope-day's labels are one Query)."""
    return {"usage_key": spent_labels_key(scope), "date_key": f"{date_key}#{label}"}


def label_of_spent_key(date_key: str) -> str:
    return date_key.split("#", 2)[2]


# The aggregator's heartbeat in DailyTotal (no usage key starts with '#').
HEARTBEAT_KEY = {"usage_key": "#AGGREGATOR", "date_key": "#HEARTBEAT"}
# Every label a config.yaml of this deployment has had (DailyTotal; ``store.daily_totals``).
CONFIG_LABELS_KEY = {"usage_key": "#AGGREGATOR", "date_key": "#CONFIG_LABELS"}


def ledger_shard_key(shard_id: str) -> dict:
    """The DailyTotal item that says how far the ledger folded stream shard ``shard_id``
    (``domain.ledger``): a partition a shard, written by that shard's one batch at a time."""
    return {"usage_key": f"#LEDGER_SHARD#{shard_id}", "date_key": "#"}


# Reconciliation (DailyTotal): the day's result, and the hour marks on label totals.
RECONCILIATION_USAGE_KEY = "#RECONCILIATION"  # no usage key starts with '#'
# A label total's hour marks (its sums as of each UTC hour it was folded in), packed in one
# binary attribute (``store.reconciliation.pack_marks``).
HOUR_MARKS = "hour_marks"


def reconciliation_key(day: str) -> dict:
    """DailyTotal item of the reconciliation of UTC day ``yyyymmdd``."""
    return {"usage_key": RECONCILIATION_USAGE_KEY, "date_key": f"RECON#{day}"}


def bill_key(day: str) -> dict:
    """DailyTotal item of the bill comparison of UTC day ``yyyymmdd``."""
    return {"usage_key": RECONCILIATION_USAGE_KEY, "date_key": f"BILL#{day}"}


def page_key(key: dict, page: int) -> dict:
    """DailyTotal item of one page of the rows of the result kept under ``key``."""
    return {**key, "date_key": f"{key['date_key']}#{page:04d}"}


MARKER_PREFIX = "APP#"  # the sort key of every usage marker, and of nothing else in UsageAggSharded


def is_marker(date_key: str) -> bool:
    """Whether a UsageAggSharded sort key is a usage marker's."""
    return str(date_key).startswith(MARKER_PREFIX)


def dedup_key(org_id: str, app_id: str, request_id: str) -> str:
    """A record's identity: the app and its ``request_id`` (not the quota scope or the day,
    so a ``request_id`` stays a duplicate whatever the org's ``quota_scope`` or timezone
    becomes during the dedup window)."""
    return f"{profile_org_key(org_id, app_id)}#REQ#{request_id}"


def marker_bucket(app_id: str, request_id: str, buckets: int) -> int:
    """Which of the org's ``buckets`` (its ``agg_shard_count``) a record's marker is under."""
    return stable_shard(f"{app_id}#{request_id}", buckets)


def marker_key(org_id: str, app_id: str, request_id: str, buckets: int) -> dict:
    """The usage marker of a record: ``ORG#{org}#MARKERS#{bucket}`` /
    ``APP#{app}#REQ#{request_id}``. An org's markers are under its ``buckets`` partition
    keys alone, so they reach at most as many stream shards however many the table has: each
    label total and scope total has that many concurrent folds at most (``domain.ledger``),
    and the audit reads an org's records by key (``usage.org_markers``)."""
    bucket = marker_bucket(app_id, request_id, buckets)
    return {"shard_key": markers_partition(org_id, bucket), "date_key": f"{MARKER_PREFIX}{app_id}#REQ#{request_id}"}


def markers_partition(org_id: str, bucket: int) -> str:
    return f"{org_key(org_id)}#MARKERS#{bucket:02d}"


def application_profile_owner_key(arn: str) -> dict:
    """The Config item naming the org that registered an application inference profile
    first (``APPLICATION_PROFILE#{arn}`` / ``OWNER``: no org key starts so)."""
    return {"org_key": f"APPLICATION_PROFILE#{arn}", "resource_key": "OWNER"}


def stable_shard(value: str, shard_count: int) -> int:
    """Shard for ``value``: the same in every process (unlike the salted ``hash()``)."""
    digest = hashlib.blake2b(value.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count


# --- StickyState: three concepts, each with its own key shape -----------------------


def sticky_key(scope: str, day: str) -> dict:
    """The scope's sticky model choice for an org day."""
    return {"scope_key": scope, "date_key": day_key(day)}


def alert_prefix(day: str) -> str:
    return f"ALERT#{day}#"


def alert_date_key(day: str, alert_type: str, subject: str, threshold: str) -> str:
    """One alert of a scope and org day (``subject``: the model id, label or ``-``)."""
    return f"{alert_prefix(day)}{alert_type}#{subject}#{threshold}"


def rate_window_key(client: str, limit_name: str, window_start: int) -> dict:
    """A client's request counter of one rate-limit window."""
    return {"scope_key": f"RATE#{client}", "date_key": f"LIMIT#{limit_name}#{window_start}"}


# --- RevokedTokens and PricingCache -------------------------------------------------


def revocation_key(jti: str) -> dict:
    return {"token_jti": jti}


def cutoff_key(client_id: str) -> dict:
    """The client's token cutoff item (``CLIENT#`` never collides with a UUID jti)."""
    return {"token_jti": f"CLIENT#{client_id}"}


def price_key(day_iso: str, region: str | None = None) -> str:
    """PricingCache sort key: ``yyyy-mm-dd`` or ``yyyy-mm-dd#{region}``."""
    return day_iso + (f"#{region}" if region else "")


# Models outside config.yaml that the daily fetch prices ({model id: Price List name}).
PRICE_LIST_REGISTRY_KEY = {"model_id": "#UNLABELLED", "price_key": "PRICE_LIST_MODELS"}
# Each component's highest on-demand price the fetcher has read (the estimate's lower bound).
PRICE_CEILING_KEY = {"model_id": "#UNLABELLED", "price_key": "CEILING"}


def estimated_key(model_id: str) -> str:
    """UsageAggSharded partition of the records counted at the estimate for ``model_id``, to
    re-price once its price is known (sort key: the record's dedup key; no ``DAY#`` sort
    key and no ``active_day``, so neither the aggregator's stream filter nor its index sees
    them; no usage scope starts with ``#``)."""
    return f"#ESTIMATED#{model_id}"


# --- StickyState: reservations (hard cap) ---------------------------------------------


def reservations_partition(scope: str, day: str) -> str:
    """StickyState ``scope_key`` of a quota scope's live holds of an org day."""
    return f"{scope}#RESERVATION#{day}"


def reservation_key(scope: str, day: str, expires_epoch: int, token: str) -> dict:
    """One live hold. The sort key starts with its expiry (``{epoch:010d}#{token}``), so
    the holds that have expired are one key-range Query (``reservation_expired_bound``)."""
    return {"scope_key": reservations_partition(scope, day), "date_key": f"{expires_epoch:010d}#{token}"}


def reservation_expired_bound(now_epoch: int) -> str:
    """Sort keys below this are holds that expired by ``now_epoch``."""
    return f"{now_epoch + 1:010d}#"
