"""The data-access seam: every DynamoDB call of the service and every key it builds or
parses live in this package, one module per table or concept. Domain modules call these
functions and never boto3's DynamoDB API.

- ``dynamo``: the connection, conditional writes, transactions, batch reads, error codes;
- ``config_items``: orgs and apps (settings and credentials), ``profiles``, ``boosts``;
- ``usage``: the exactly-once usage write (dedup marker + shard) and shard reads;
- ``daily_totals``: what the aggregator writes and selection, aggregates and reports read;
- ``sticky``, ``alert_records``, ``rate_windows``: the three concepts of StickyState;
- ``revocations`` and ``prices``: RevokedTokens and PricingCache.
"""
