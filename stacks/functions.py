"""One Lambda function per HTTP function and job of ``price_keeper.routes``, each with its
own role holding only what ``access.py`` grants it."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from price_keeper import routes

from . import LAMBDAS_DIR, access
from .layer import SharedLayers
from .settings import ARCHITECTURE, METRICS_NAMESPACE, RUNTIME, SERVICE_NAME, Settings
from .storage import Tables

FUNCTIONS: tuple[str, ...] = routes.HTTP_FUNCTIONS + routes.JOBS

# Functions whose code asset is the whole lambdas/ directory: the docs function builds the
# OpenAPI document from every handler's router.
WHOLE_LAMBDAS_DIR = frozenset({"docs"})


@dataclass(frozen=True)
class Sizing:
    memory_mb: int = 512
    timeout_s: int = 10
    # Concurrency reserved for the function (and its cap), so that a burst elsewhere in the
    # account cannot starve it (docs/infrastructure.md, "Concurrency"); None: the shared pool.
    reserved_concurrency: int | None = None


# bcrypt (cost 12) hashes and checks secrets: give those functions a full vCPU.
# The aggregator's audit plan pages the active-by-day index of the days in play; the pricing fetcher pages
# through the Price List API once a day; the reconciler and the bill read every label total of four org days
# (a fleet's: ~1 M, in pages) with a full vCPU for their Python.
SIZING: dict[str, Sizing] = {
    "auth_token": Sizing(memory_mb=1769),
    "put_org": Sizing(memory_mb=1769),
    "put_app": Sizing(memory_mb=1769),
    "rotate_credentials": Sizing(memory_mb=1769),
    "aggregator": Sizing(memory_mb=1024, timeout_s=50, reserved_concurrency=100),
    "model_selection": Sizing(reserved_concurrency=200),
    "pricing_fetcher": Sizing(memory_mb=512, timeout_s=300),
    "reconciler": Sizing(memory_mb=1769, timeout_s=600),
    "bill": Sizing(memory_mb=1769, timeout_s=600),
}

# Lambda refuses a reservation that leaves fewer executions than this unreserved (new
# accounts often have a limit of 10 or 50: any reservation then fails the deploy).
UNRESERVED_MINIMUM = 100


def reserved_concurrency(settings: Settings) -> dict[str, int]:
    """The functions' reserved concurrency as ``reserveConcurrency`` and ``accountConcurrency``
    say: ``auto`` reserves only where the account is known to have room (a plain ``cdk
    deploy``, which does not say, reserves nothing), ``true`` reserves and refuses an
    account known to be too small, ``false`` never reserves."""
    wanted = {name: sizing.reserved_concurrency for name, sizing in SIZING.items() if sizing.reserved_concurrency}
    limit = settings.account_concurrency
    room = limit is not None and limit - sum(wanted.values()) >= UNRESERVED_MINIMUM
    if settings.reserve_concurrency == "true" and limit is not None and not room:
        raise ValueError(
            f"reserveConcurrency=true reserves {sum(wanted.values())} executions, but the account's limit is "
            f"{limit} and Lambda keeps {UNRESERVED_MINIMUM} unreserved: ask AWS to raise it, or deploy with "
            "reserveConcurrency=auto (reserves nothing there)"
        )
    if settings.reserve_concurrency == "true" or (settings.reserve_concurrency == "auto" and room):
        return wanted
    return {}


def traced(settings: Settings, name: str) -> bool:
    """Whether ``name`` has X-Ray active tracing: every function (``all``), none, or the jobs
    alone (``jobs``, the default: a few runs a minute, where a trace pays; a trace of every
    API request is about $700 a month at 1,000 requests/s, docs/performance.md)."""
    return settings.tracing == "all" or (settings.tracing == "jobs" and name in routes.JOBS)


# Lambda's JSON log format names Python's WARNING level WARN.
APPLICATION_LOG_LEVELS = {"WARNING": "WARN", "CRITICAL": "FATAL"}

RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


def construct_id(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def code_and_handler(name: str) -> tuple[lambda_.Code, str]:
    excluded = ["**/__pycache__", "*.pyc", "tests"]
    if name in WHOLE_LAMBDAS_DIR:
        return lambda_.Code.from_asset(str(LAMBDAS_DIR), exclude=excluded), f"{name}/handler.lambda_handler"
    return lambda_.Code.from_asset(str(LAMBDAS_DIR / name), exclude=excluded), "handler.lambda_handler"


class Functions(Construct):
    """``self.by_name[name]`` for every name in ``FUNCTIONS``."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: Settings,
        tables: Tables,
        layers: SharedLayers,
        jwt_secret: secretsmanager.ISecret,
        provisioning_secret: secretsmanager.ISecret,
        extra_environment: dict[str, dict[str, str]],
    ):
        super().__init__(scope, id)
        missing = [name for name in FUNCTIONS if not (LAMBDAS_DIR / name / "handler.py").is_file()]
        if missing:
            raise FileNotFoundError(f"no lambdas/<name>/handler.py for: {', '.join(missing)}")
        self.by_name: dict[str, lambda_.Function] = {}
        reserved = reserved_concurrency(settings)
        log_level = lambda_.ApplicationLogLevel(APPLICATION_LOG_LEVELS.get(settings.log_level, settings.log_level))
        for name in FUNCTIONS:
            environment = {
                "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
                "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
                "POWERTOOLS_LOG_LEVEL": settings.log_level,
                **{spec.env: tables.by_spec[spec].table_name for spec in access.tables_of(name)},
                **extra_environment.get(name, {}),
            }
            if settings.cors_origins and name in routes.HTTP_FUNCTIONS:
                # Their answers carry the CORS headers (price_keeper.http.api.cors_config).
                environment["CORS_ORIGINS"] = ",".join(settings.cors_origins)
            if name in access.JWT_READERS:
                environment["JWT_SECRET_NAME"] = jwt_secret.secret_arn
            if name in access.PROVISIONING_READERS:
                environment["PROVISIONING_SECRET_NAME"] = provisioning_secret.secret_arn
            function_name = f"{settings.prefix}{name.replace('_', '-')}"
            log_group = logs.LogGroup(
                self,
                f"{construct_id(name)}Logs",
                log_group_name=f"/aws/lambda/{function_name}",
                retention=RETENTION[settings.log_retention_days],
                removal_policy=RemovalPolicy.DESTROY,
            )
            # Our own role instead of AWSLambdaBasicExecutionRole: logs only to its own group.
            role = iam.Role(
                self,
                f"{construct_id(name)}Role",
                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                description=f"Bedrock Price Keeper {name} function",
            )
            code, handler = code_and_handler(name)
            sizing = SIZING.get(name, Sizing())
            function = lambda_.Function(
                self,
                construct_id(name),
                function_name=function_name,
                description=f"Bedrock Price Keeper: {name}",
                runtime=RUNTIME,
                architecture=ARCHITECTURE,
                handler=handler,
                code=code,
                layers=[layers.common, layers.powertools],
                environment=environment,
                memory_size=sizing.memory_mb,
                reserved_concurrent_executions=reserved.get(name),
                timeout=Duration.seconds(sizing.timeout_s),
                tracing=lambda_.Tracing.ACTIVE if traced(settings, name) else lambda_.Tracing.DISABLED,
                logging_format=lambda_.LoggingFormat.JSON,
                application_log_level_v2=log_level,
                system_log_level_v2=lambda_.SystemLogLevel.WARN,
                log_group=log_group,
                role=role,
            )
            log_group.grant_write(role)
            self._grant_tables(name, role, tables)
            if name in access.JWT_READERS:
                jwt_secret.grant_read(role)
            if name in access.PROVISIONING_READERS:
                provisioning_secret.grant_read(role)
            self._grant_aws_apis(name, role)
            self.by_name[name] = function

    @staticmethod
    def _grant_tables(name: str, role: iam.Role, tables: Tables) -> None:
        for target, actions in access.TABLE_ACCESS[name].items():
            if isinstance(target, tuple):
                spec, index = target
                resource = f"{tables.by_spec[spec].table_arn}/index/{index.name}"
            else:
                resource = tables.by_spec[target].table_arn
            role.add_to_policy(iam.PolicyStatement(actions=list(actions), resources=[resource]))

    @staticmethod
    def _grant_aws_apis(name: str, role: iam.Role) -> None:
        stack = Stack.of(role)
        if name in access.INFERENCE_PROFILE_READERS:
            # Profiles are resolved in the calling region, which can be any region.
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["bedrock:GetInferenceProfile"],
                    resources=[
                        f"arn:{stack.partition}:bedrock:*:{stack.account}:inference-profile/*",
                        f"arn:{stack.partition}:bedrock:*:{stack.account}:application-inference-profile/*",
                    ],
                )
            )
        if name in access.FOUNDATION_MODEL_READERS:
            # Foundation models are AWS's own (no account in the ARN), in any region.
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["bedrock:GetFoundationModel"],
                    resources=[f"arn:{stack.partition}:bedrock:*::foundation-model/*"],
                )
            )
        if name in access.BEDROCK_METRICS_READERS:
            # CloudWatch's metric reads have no resource-level permissions: "*" is the only resource.
            role.add_to_policy(
                iam.PolicyStatement(actions=["cloudwatch:GetMetricData", "cloudwatch:ListMetrics"], resources=["*"])
            )
        if name in access.COST_EXPLORER_READERS:
            # Cost Explorer's GetCostAndUsage reads the account's bill: "*" is its resource.
            role.add_to_policy(iam.PolicyStatement(actions=["ce:GetCostAndUsage"], resources=["*"]))
        if name in access.PRICE_LIST_READERS:
            # The Price List API has no resource-level permissions: "*" is the only resource.
            role.add_to_policy(iam.PolicyStatement(actions=["pricing:GetProducts"], resources=["*"]))
