"""Least-privilege access of every function: which tables (and indexes) it may touch with
which DynamoDB actions, and which secrets and AWS APIs it may use.

This map is the contract between the layer code and the deployed IAM policies: a function
gets exactly these actions on exactly these tables, and the table-name environment
variables of exactly these tables. The building blocks below are named after the layer
functions that make the calls; when a layer function starts calling a new table or
action, change its block here (DynamoDB Local and moto do not check IAM, so only a
deployment would notice). The infrastructure tests check that the deployed policies equal
this map, that it covers every function, and that it never grants ``dynamodb:*``.
"""

from __future__ import annotations

from price_keeper import routes
from price_keeper.store.tables import (
    ACTIVE_BY_DAY,
    ALL_TABLES,
    CONFIG,
    DAILY_TOTAL,
    PRICING_CACHE,
    REVOKED_TOKENS,
    STICKY_STATE,
    USAGE_AGG_SHARDED,
    Index,
    TableSpec,
)

GET = "dynamodb:GetItem"
BATCH_GET = "dynamodb:BatchGetItem"
QUERY = "dynamodb:Query"
PUT = "dynamodb:PutItem"
UPDATE = "dynamodb:UpdateItem"
CONDITION_CHECK = "dynamodb:ConditionCheckItem"
DELETE = "dynamodb:DeleteItem"

# Targets: a table, or an index of a table (a Query on an index needs the index's ARN).
Target = TableSpec | tuple[TableSpec, Index]
Grants = dict[Target, tuple[str, ...]]


def merge(*parts: Grants) -> Grants:
    merged: dict[Target, list[str]] = {}
    for part in parts:
        for target, actions in part.items():
            merged.setdefault(target, [])
            merged[target] += [a for a in actions if a not in merged[target]]
    return {target: tuple(actions) for target, actions in merged.items()}


# --- building blocks: the calls of each price_keeper.store function -------------------
AUTH_DECODE = {REVOKED_TOKENS: (BATCH_GET,)}  # revocations.read (every bearer token)
AUTH_REVOKE = {REVOKED_TOKENS: (PUT,)}  # revocations.revoke
CLIENT_CUTOFF = {REVOKED_TOKENS: (UPDATE,)}  # revocations.cutoff_update (in config_items.write_with_cutoff)
AUTH_CLIENT = {CONFIG: (GET,)}  # config_items.client_item (auth.authenticate_client)
EFFECTIVE_CONFIG = {CONFIG: (BATCH_GET,)}  # config_items.org_and_app (orgs.effective_config)
# config_items.app_items, profiles.labels:
ORG_CHILDREN = {CONFIG: (QUERY,)}
PROFILE_LOOKUP = {CONFIG: (BATCH_GET,)}  # profiles.find_many (known_labels, bedrock_ids, priced_model)
PROFILE_REGISTER = {CONFIG: (PUT,)}  # profiles.create (conditional put)
CONFIG_SAVE = {CONFIG: (UPDATE, PUT)}  # config_items.update_existing, else config_items.create
# boosts.create: the boost's item and its scope item's map in one transaction
BOOST_CREATE = {CONFIG: (PUT, UPDATE)}
DAILY_TOTALS = {DAILY_TOTAL: (BATCH_GET,)}  # daily_totals.day_read (aggregation.read_daily_totals)
DAILY_STATUS = {DAILY_TOTAL: (BATCH_GET,)}  # daily_totals.read_days (metering.quota_position)
DAILY_RANGE = {DAILY_TOTAL: (QUERY,)}  # daily_totals.days_between (reports)
SPENT_LABELS = {DAILY_TOTAL: (QUERY,)}  # daily_totals.spent_labels (aggregates and reports)
CONFIG_LABELS_EVER = {DAILY_TOTAL: (BATCH_GET,)}  # orgs.config_labels_ever (reports; the others read totals so)
STICKY_READ = {STICKY_STATE: (GET,)}  # sticky.read
# selection.current_decision: DailyTotals and StickyState in one call (dynamo.batch_get_many)
SELECTION_READ = {DAILY_TOTAL: (BATCH_GET,), STICKY_STATE: (BATCH_GET,)}
STICKY_ADVANCE = {STICKY_STATE: (UPDATE,)}  # sticky.add_passed (ADD to a set)
PRICE_QUOTE = {PRICING_CACHE: (BATCH_GET,)}  # prices.of_day (pricing.quote)
# prices.add_missing (conditional update), registered_models and register_model
PRICE_STORE = {PRICING_CACHE: (GET, UPDATE)}
# usage.estimated_records, reprice_once: TransactWriteItems of a Delete and an Update (pricing.reprice)
REPRICE = {USAGE_AGG_SHARDED: (QUERY, DELETE, UPDATE)}
# selection.recommend: the choice, moved forward, and the price of the chosen label (model
# selection, and a usage answer asked for it: ?model_selection=true)
SELECTION = merge(SELECTION_READ, STICKY_ADVANCE, PRICE_QUOTE, PROFILE_LOOKUP)
# usage.write_group: the marker's Put, alone or in a TransactWriteItems with the label-day's index entry
USAGE_RECORD = {USAGE_AGG_SHARDED: (PUT, UPDATE)}
# voids: usage.read_marker, then usage.write_once of the marker's Update
USAGE_VOID = {USAGE_AGG_SHARDED: (GET, UPDATE), DAILY_TOTAL: (UPDATE,)}  # (a settling record's ledgers)
AGGREGATION = {  # repair.run and plan_audit (the audit), ledger.fold_batch, rederive.rederive
    (USAGE_AGG_SHARDED, ACTIVE_BY_DAY): (QUERY,),  # usage.active_label_days (the audit)
    # one BatchGetItem of daily_totals.fold_read and sticky.days_read; put_heartbeat; the
    # ledger's chunks: their totals, the stream shard's progress (daily_totals.folded_to,
    # write_folded) and label-days' index entries (usage.day_listed); usage.org_markers
    USAGE_AGG_SHARDED: (UPDATE, QUERY),
    DAILY_TOTAL: (BATCH_GET, GET, UPDATE, PUT),
    STICKY_STATE: (BATCH_GET,),
}
DAY_SPEND_CHECK = {(USAGE_AGG_SHARDED, ACTIVE_BY_DAY): (QUERY,)}  # usage.org_has_spend (PUT org)
ALERT_LIST = {STICKY_STATE: (QUERY,)}  # alert_records.of_day / of_day_many
# alerts.evaluate_and_fire: alert_records.of_day, create, claim, mark_published (boosts: ORG_CHILDREN)
ALERT_FIRE = {STICKY_STATE: (QUERY, PUT, UPDATE)}
# reservations.hold (a transaction of a Put and ledger Updates), read, expired (the sweep),
# end (a conditional Delete and ledger Updates); DailyTotals read before the hold
RESERVE = {STICKY_STATE: (PUT, GET, QUERY, DELETE), DAILY_TOTAL: (BATCH_GET, UPDATE)}
# metering.record with a reservation_id: read the hold, Delete it and ADD to the ledgers in
# the usage write's transaction
SETTLE = {STICKY_STATE: (GET, DELETE), DAILY_TOTAL: (UPDATE,)}
RATE_LIMIT = {STICKY_STATE: (UPDATE,)}  # rate_windows.lease / give_back (routes with a rate_limit)
RECONCILIATION_READ = {DAILY_TOTAL: (GET,)}  # reconciliation.get_result (and the page asked for)
RECONCILE = {  # reconciliation.label_totals (the active-by-day index, then the totals), put_result / put_bill
    (USAGE_AGG_SHARDED, ACTIVE_BY_DAY): (QUERY,),
    DAILY_TOTAL: (BATCH_GET, PUT),
}

_TABLES: dict[str, Grants] = {
    "health": {CONFIG: (GET,)},  # service.health
    "docs": {},
    "auth_token": AUTH_CLIENT,
    # OAuth2 forms authenticate the client on refresh and revocation too (oauth.py)
    "auth_refresh": merge(AUTH_DECODE, AUTH_CLIENT),
    "auth_revoke": merge(AUTH_DECODE, AUTH_REVOKE, AUTH_CLIENT, EFFECTIVE_CONFIG),
    "put_org": merge(EFFECTIVE_CONFIG, ORG_CHILDREN, CONFIG_SAVE, DAY_SPEND_CHECK),
    "put_app": merge(EFFECTIVE_CONFIG, ORG_CHILDREN, CONFIG_SAVE),
    # provisioning.rotate_credentials / revoke_tokens: a transaction of a conditional action
    # on the client's Config item and its cutoff
    "rotate_credentials": merge({CONFIG: (UPDATE,)}, CLIENT_CUTOFF),
    "revoke_tokens": merge({CONFIG: (CONDITION_CHECK,)}, CLIENT_CUTOFF),
    "quota_boosts": merge(EFFECTIVE_CONFIG, BOOST_CREATE),
    "void_usage": merge(EFFECTIVE_CONFIG, USAGE_VOID),
    "aggregates": merge(
        AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, PROFILE_LOOKUP, DAILY_TOTALS, SPENT_LABELS, STICKY_READ
    ),
    "model_selection": merge(AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, SELECTION),
    # ORG_CHILDREN: profiles.labels, the app's count against MAX_PROFILES_PER_APP
    "inference_profiles": merge(AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, PROFILE_REGISTER),
    # metering.count: UNPRICED_MODEL and OVER_RESERVATION alerts; reservations' settlement;
    # the selection a usage answer carries when asked
    **dict.fromkeys(
        ("usage", "usage_batch"),
        merge(
            AUTH_DECODE,
            EFFECTIVE_CONFIG,
            ORG_CHILDREN,
            PROFILE_LOOKUP,
            PRICE_QUOTE,
            USAGE_RECORD,
            DAILY_STATUS,
            ALERT_FIRE,
            SETTLE,
            SELECTION,
        ),
    ),
    "reservations": merge(AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, PROFILE_LOOKUP, PRICE_QUOTE, RESERVE),
    "spend_report": merge(AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, DAILY_RANGE, CONFIG_LABELS_EVER),
    "alerts": merge(AUTH_DECODE, EFFECTIVE_CONFIG, ORG_CHILDREN, ALERT_LIST),
    # (+ the usage table's stream, read by its event source mapping: stacks/streams.py)
    "aggregator": merge(AGGREGATION, EFFECTIVE_CONFIG, ORG_CHILDREN, STICKY_READ, ALERT_FIRE),
    "pricing_fetcher": merge(PRICE_STORE, PRICE_QUOTE, REPRICE),
    "reconciliation": RECONCILIATION_READ,
    # domain.reconciliation: the labels' models and prices (effective config, profiles,
    # PricingCache) and UNREPORTED_USAGE (alerts.fire_once)
    "reconciler": merge(RECONCILE, EFFECTIVE_CONFIG, PROFILE_LOOKUP, PRICE_QUOTE, ALERT_FIRE),
    # domain.bill: the metered side of reconciliation, priced the same way
    "bill": merge(RECONCILE, EFFECTIVE_CONFIG, PROFILE_LOOKUP, PRICE_QUOTE),
}


_RATE_LIMITED = {route.function for route in routes.ROUTES if route.rate_limit}

TABLE_ACCESS: dict[str, Grants] = {
    function: merge(grants, RATE_LIMIT) if function in _RATE_LIMITED else grants for function, grants in _TABLES.items()
}

# Secrets each function may read. The signing key: the token endpoints and every function
# that authorizes a bearer token. The provisioning key: the X-API-Key endpoints.
JWT_READERS = frozenset(
    {
        "auth_token",
        "auth_refresh",
        "auth_revoke",
        "aggregates",
        "model_selection",
        "inference_profiles",
        "usage",
        "usage_batch",
        "reservations",
        "spend_report",
        "alerts",
    }
)
PROVISIONING_READERS = frozenset(
    {"put_org", "put_app", "rotate_credentials", "revoke_tokens", "quota_boosts", "reconciliation", "void_usage"}
)

# Functions that resolve inference profiles to models (GetInferenceProfile): registration
# (profiles.register refuses what it cannot resolve), metering (profiles.priced_model), and
# the price shown by model selection.
INFERENCE_PROFILE_READERS = frozenset(
    {"inference_profiles", "usage", "usage_batch", "model_selection", "reconciler", "reservations"}
)
# Functions that read AWS Price List prices (aws.price_list.fetch_price_list → GetProducts).
PRICE_LIST_READERS = frozenset({"pricing_fetcher"})
# Functions that look up a foundation model's name (aws.bedrock.foundation_model_name → GetFoundationModel).
FOUNDATION_MODEL_READERS = frozenset({"pricing_fetcher"})
# Functions that publish alert events on the service's event bus (aws.events.put_alert): the
# aggregator (spend alerts), metering (UNPRICED_MODEL) and the reconciler (UNREPORTED_USAGE).
ALERT_PUBLISHERS = frozenset({"aggregator", "usage", "usage_batch", "reconciler"})
# Functions that read Bedrock's own counts (aws.cloudwatch.bedrock_sums: ListMetrics, GetMetricData).
BEDROCK_METRICS_READERS = frozenset({"reconciler"})
# Functions that read Cost Explorer (aws.cost_explorer.billed_by_tag: GetCostAndUsage).
COST_EXPLORER_READERS = frozenset({"bill"})


def tables_of(function: str) -> list[TableSpec]:
    """Tables a function touches, in ``ALL_TABLES`` order (their env vars go on the function)."""
    touched = {target[0] if isinstance(target, tuple) else target for target in TABLE_ACCESS[function]}
    return [spec for spec in ALL_TABLES if spec in touched]


def touched_tables() -> list[TableSpec]:
    """Tables some function may touch, in ``ALL_TABLES`` order (the others see no requests)."""
    touched = {spec for function in TABLE_ACCESS for spec in tables_of(function)}
    return [spec for spec in ALL_TABLES if spec in touched]
