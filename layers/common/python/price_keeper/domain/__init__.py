"""The rules of the service: metering, pricing, selection, aggregation, alerts, reports,
auth and provisioning. Pure where they can be (``quota``); all storage through ``store``."""
