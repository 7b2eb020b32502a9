"""Python client for Bedrock Price Keeper: guarded Bedrock calls (or any boto3 client's, instrumented),
usage reporting, provisioning."""

from ._version import __version__
from .admin import Provisioning
from .batch_jobs import BatchJobReport, report_batch_job
from .bedrock import ConverseResult, ConverseStream, GuardedBedrock
from .client import PriceKeeper
from .errors import (
    AlreadyExists,
    ConnectionFailed,
    Forbidden,
    InternalError,
    InvalidConfig,
    InvalidModelLabel,
    InvalidRequest,
    NotFound,
    PriceKeeperError,
    QuotaExceeded,
    RateLimitExceeded,
    ServiceUnavailable,
    Unauthorized,
)
from .instrument import Instrumentation, instrument, uninstrument
from .models import (
    BatchResult,
    CarriedSelection,
    Credentials,
    DailySpend,
    LabelSpend,
    ModelChoice,
    Provisioned,
    Rotation,
    ScopeTotal,
    UsageReceipt,
    UsageRecord,
)
from .retry import RetryPolicy

__all__ = [
    "__version__",
    "PriceKeeper",
    "instrument",
    "uninstrument",
    "Instrumentation",
    "Provisioning",
    "GuardedBedrock",
    "ConverseResult",
    "ConverseStream",
    "RetryPolicy",
    "report_batch_job",
    "BatchJobReport",
    "PriceKeeperError",
    "ConnectionFailed",
    "InvalidRequest",
    "InvalidConfig",
    "InvalidModelLabel",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "QuotaExceeded",
    "RateLimitExceeded",
    "InternalError",
    "ServiceUnavailable",
    "BatchResult",
    "CarriedSelection",
    "Credentials",
    "DailySpend",
    "LabelSpend",
    "ModelChoice",
    "Provisioned",
    "Rotation",
    "ScopeTotal",
    "UsageReceipt",
    "UsageRecord",
]
