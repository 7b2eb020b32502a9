"""The seven DynamoDB tables, built from ``price_keeper.store.tables.ALL_TABLES``."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from price_keeper.store.tables import ALL_TABLES, DAILY_TOTAL, TableSpec

from .settings import Settings

# The table whose changes a stream consumer of yours may want beside the usage table's
# (``enableStreams``: totals as they fold); its stream then carries full images.
STREAMED = (DAILY_TOTAL,)


def _key(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


def _stream(settings: Settings, spec: TableSpec) -> dynamodb.StreamViewType | None:
    """The view the service reads (the usage table's images, which the ledger folds), or
    full images for ``enableStreams``."""
    if spec.stream:
        return dynamodb.StreamViewType(spec.stream)
    return dynamodb.StreamViewType.NEW_AND_OLD_IMAGES if settings.enable_streams and spec in STREAMED else None


def physical_name(settings: Settings, spec: TableSpec) -> str:
    return settings.prefix + spec.name


class Tables(Construct):
    """``self.by_spec[spec]`` is the table of each ``TableSpec``.

    Tables that hold money (org config and credentials, usage records, daily totals) survive
    ``cdk destroy`` and replacement, and have deletion protection (``deletionProtection``),
    but a create that fails deletes them again (``RetainExceptOnCreate``): a retry of a
    failed first deploy does not meet tables of the same names. DynamoDB refuses to delete
    a protected table, so a stage's first create runs without protection and the next deploy
    turns it on (``make deploy`` does both). The others are caches, revocations with
    a TTL, or unused, and go with the stack. Every table has point-in-time recovery: it is
    billed on table size, which is kilobytes for the small tables (well under a cent a
    month), and DynamoDB keeps a backup of a deleted PITR table for 35 days, so the
    revocations and sticky state a mistaken ``cdk destroy`` deleted can be restored.
    """

    def __init__(self, scope: Construct, id: str, settings: Settings):
        super().__init__(scope, id)
        self.by_spec: dict[TableSpec, dynamodb.Table] = {}
        for spec in ALL_TABLES:
            table = dynamodb.Table(
                self,
                "".join(part.title() for part in spec.name.split("-")),
                table_name=physical_name(settings, spec),
                partition_key=_key(spec.partition_key),
                sort_key=_key(spec.sort_key) if spec.sort_key else None,
                billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
                time_to_live_attribute=spec.ttl_attribute,
                point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True
                ),
                deletion_protection=spec.holds_money and settings.deletion_protection,
                removal_policy=RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE if spec.holds_money else RemovalPolicy.DESTROY,
                stream=_stream(settings, spec),
            )
            for index in spec.indexes:
                table.add_global_secondary_index(
                    index_name=index.name,
                    partition_key=_key(index.partition_key),
                    sort_key=_key(index.sort_key) if index.sort_key else None,
                    projection_type=dynamodb.ProjectionType(index.projection),
                )
            self.by_spec[spec] = table
