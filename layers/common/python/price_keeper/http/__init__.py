"""The wire: routes, the request pipeline (ids, authentication, rate limits) that runs
before any handler, replies and errors in the api_spec.md shapes, and the OpenAPI
document. Handlers call into ``domain``; nothing here talks to DynamoDB but through
``store`` (rate-limit windows)."""
