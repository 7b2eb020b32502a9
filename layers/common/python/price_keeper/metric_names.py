"""Names of the custom metrics that the CDK stack plots or alarms on, spelled once for the
code that publishes them (Powertools ``metrics``, as EMF log lines) and for
``stacks/monitoring.py``. Nothing is imported, so the CDK app reads this without Powertools.

Every metric carries one dimension, Powertools' ``service``. CloudWatch bills each unique
combination of name and dimension values as a custom metric (about $0.30 a month), so a
dimension per org, app or label would multiply the bill by the number of tenants.
EMF has no per-call charge, and an event that happens rarely (a sticky flip, a
revocation) emits nothing on the invocations where it does not happen. The logs say which
tenant it happened to.
"""

from __future__ import annotations

# Aggregator (once a minute)
AGGREGATOR_LAG_SECONDS = "AggregatorLagSeconds"
# The share of each daily quota used, one value per quota of every scope whose current
# org-local day this run changed (alerts.spend_pcts). Maximum is the scope closest to its quota.
SPEND_PCT = "SpendPct"
# Model selection moved a scope's sticky state to a later label (selection.write_sticky).
STICKY_FLIPS = "StickyFlips"
# POST /auth/revoke stored a revocation (auth.revoke).
TOKENS_REVOKED = "TokensRevoked"
# POST .../credentials/revoke-tokens ended every token of a client (provisioning.revoke_tokens).
CLIENT_TOKENS_REVOKED = "ClientTokensRevoked"
