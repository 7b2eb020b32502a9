"""Deployment settings, read from CDK context (``cdk.json`` or ``-c key=value``).

| context key | default | meaning |
|---|---|---|
| ``stage`` | ``dev`` | stage name: API stage, stack name and resource-name suffix |
| ``tablePrefix`` | ``price-keeper-<stage>-`` | physical table name = prefix + ``TableSpec.name`` |
| ``region`` | the CLI's default region | region of the stack |
| ``apiKind`` | ``http`` | ``http`` (HTTP API, payload 2.0) or ``rest`` (REST API); docs/infrastructure.md |
| ``configPath`` | ``config.yaml`` | model labels / defaults file shipped in the shared layer |
| ``enableStreams`` | ``false`` | a DailyTotal stream with full images (UsageAggSharded always streams them) |
| ``corsOrigins`` | empty (CORS off) | comma-separated origins allowed by the API's CORS preflight |
| ``alertEmail`` | empty | e-mail address subscribed to the alert topic |
| ``alertWebhookUrl`` | empty | ``https://`` chat webhook (e.g. Slack) that gets each alert as ``{"text": ...}`` |
| ``throttleRateLimit`` / ``throttleBurstLimit`` | ``5000`` / ``5000`` | API stage throttling (requests/s, burst) |
| ``logLevel`` | ``INFO`` | application log level of every function (Lambda's JSON log format; Powertools') |
| ``logRetentionDays`` | ``30`` | retention of function and access logs |
| ``accessLogs`` | ``true`` | the API stage's access logs (infrequent-access log class) |
| ``tracing`` | ``jobs`` | X-Ray active tracing: ``jobs`` (the aggregator and the scheduled jobs), ``all``, ``none`` |
| ``powertoolsLayerVersion`` | unset | a fixed version of the AWS-managed Powertools layer instead of the pinned one's |
| ``reserveConcurrency`` | ``auto`` | for two functions: ``auto`` (where the account has room), ``true``, ``false`` |
| ``accountConcurrency`` | unset | the account's Lambda concurrency limit (``make deploy`` reads and sets it) |
| ``deletionProtection`` | ``true`` | of the money tables; ``false`` on a stage's first create (``make deploy``) |
| ``bundleLayer`` | ``true`` | ``false`` ships the unbundled layer source (offline synth in tests; not deployable) |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from constructs import Node

from . import REPO_ROOT

# One architecture for every function and the shared layer. arm64 (Graviton) costs about
# 20% less per GB-second than x86_64 and every native wheel we ship (bcrypt, PyYAML) is
# published for manylinux2014_aarch64.
ARCHITECTURE = lambda_.Architecture.ARM_64
PIP_PLATFORM = "manylinux2014_aarch64"
POWERTOOLS_ARCH = "arm64"
RUNTIME = lambda_.Runtime.PYTHON_3_12
PYTHON_VERSION = "3.12"

SERVICE_NAME = "price-keeper"
METRICS_NAMESPACE = "BedrockPriceKeeper"
ALERT_EVENT_SOURCE = "price-keeper"


def _flag(value, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _origins(value) -> tuple[str, ...]:
    if not value:
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(item.strip() for item in items if item.strip())


API_KINDS = ("http", "rest")


def _api_kind(value) -> str:
    kind = str(value or "http").strip().lower()
    if kind not in API_KINDS:
        raise ValueError(f"apiKind must be one of {', '.join(API_KINDS)}, not {value!r}")
    return kind


RESERVE_CHOICES = ("auto", "true", "false")
TRACING_CHOICES = ("jobs", "all", "none")


def _choice(name: str, value, choices: tuple[str, ...]) -> str:
    chosen = str(value if value is not None else choices[0]).strip().lower()
    chosen = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(chosen, chosen)
    if chosen not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return chosen


def _https(value) -> str | None:
    if not value:
        return None
    if not str(value).startswith("https://"):
        raise ValueError("alertWebhookUrl must be an https:// URL")
    return str(value)


@dataclass(frozen=True)
class Settings:
    stage: str = "dev"
    table_prefix: str = ""
    region: str | None = None
    api_kind: str = "http"
    config_path: Path = REPO_ROOT / "config.yaml"
    enable_streams: bool = False
    cors_origins: tuple[str, ...] = ()
    alert_email: str | None = None
    alert_webhook_url: str | None = None
    throttle_rate_limit: float = 5000  # docs/infrastructure.md "Stage throttling"
    throttle_burst_limit: int = 5000
    log_level: str = "INFO"
    log_retention_days: int = 30
    powertools_layer_version: int | None = None  # None: the layer of requirements.txt's pin
    bundle_layer: bool = True
    reserve_concurrency: str = "auto"  # RESERVE_CHOICES
    account_concurrency: int | None = None
    deletion_protection: bool = True
    access_logs: bool = True
    tracing: str = "jobs"  # TRACING_CHOICES

    @property
    def prefix(self) -> str:
        """Name prefix of the stage's resources (tables, functions, bus, topic...)."""
        return self.table_prefix or f"{SERVICE_NAME}-{self.stage}-"

    @property
    def secret_prefix(self) -> str:
        return f"{SERVICE_NAME}/{self.stage}/"

    @classmethod
    def from_context(cls, node: Node) -> Settings:
        get = node.try_get_context
        stage = str(get("stage") or cls.stage)
        config = Path(str(get("configPath") or cls.config_path))
        return cls(
            stage=stage,
            table_prefix=str(get("tablePrefix") or ""),
            region=get("region") or None,
            api_kind=_api_kind(get("apiKind")),
            config_path=config if config.is_absolute() else REPO_ROOT / config,
            enable_streams=_flag(get("enableStreams"), False),
            cors_origins=_origins(get("corsOrigins")),
            alert_email=get("alertEmail") or None,
            alert_webhook_url=_https(get("alertWebhookUrl")),
            throttle_rate_limit=float(get("throttleRateLimit") or cls.throttle_rate_limit),
            throttle_burst_limit=int(get("throttleBurstLimit") or cls.throttle_burst_limit),
            log_level=str(get("logLevel") or cls.log_level).upper(),
            log_retention_days=int(get("logRetentionDays") or cls.log_retention_days),
            powertools_layer_version=int(get("powertoolsLayerVersion")) if get("powertoolsLayerVersion") else None,
            bundle_layer=_flag(get("bundleLayer"), True),
            reserve_concurrency=_choice("reserveConcurrency", get("reserveConcurrency"), RESERVE_CHOICES),
            account_concurrency=int(get("accountConcurrency")) if get("accountConcurrency") else None,
            deletion_protection=_flag(get("deletionProtection"), True),
            access_logs=_flag(get("accessLogs"), True),
            tracing=_choice("tracing", get("tracing"), TRACING_CHOICES),
        )
