"""Event-driven aggregation: the usage table's stream, the aggregator's event source
mapping (batching window, no bisecting, retried until folded, the tumbling window that
names a batch's shard, filter), its grants and the iterator-age alarm."""

from __future__ import annotations

import json

import pytest

from price_keeper.domain import aggregation
from price_keeper.store.tables import ALL_TABLES, DAILY_TOTAL, USAGE_AGG_SHARDED

from .cfn import logical_id, referenced_ids, role_statements

pytestmark = pytest.mark.infra


def _mapping(synth) -> dict:
    """The stream's mapping (the repair queue has the other)."""
    (mapping,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    ]
    return mapping


def _table(synth, spec) -> dict:
    return synth.json["Resources"][synth.table_ids()[spec]]["Properties"]


def test_only_the_usage_table_streams_by_default_with_the_images_the_ledger_folds(synth):
    for spec in ALL_TABLES:
        props = _table(synth, spec)
        if spec is USAGE_AGG_SHARDED:
            assert props["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
        else:
            assert "StreamSpecification" not in props, spec.name


def test_enable_streams_gives_the_totals_full_images_too(synth_options):
    for spec in (USAGE_AGG_SHARDED, DAILY_TOTAL):
        assert _table(synth_options, spec)["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}


@pytest.mark.parametrize("which", ["synth", "synth_options"])
def test_the_usage_stream_triggers_the_aggregator(request, which):
    synth = request.getfixturevalue(which)
    props = _mapping(synth)
    assert logical_id(props["FunctionName"]) == synth.function_ids()["aggregator"]
    assert props["EventSourceArn"] == {"Fn::GetAtt": [synth.table_ids()[USAGE_AGG_SHARDED], "StreamArn"]}
    assert props["StartingPosition"] == "TRIM_HORIZON"
    assert 0 < props["MaximumBatchingWindowInSeconds"] <= 1
    assert props["BatchSize"] == aggregation.USAGE_STREAM.batch_size
    assert props["BisectBatchOnFunctionError"] is False  # a ledger chunk comes again from where it started
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]  # resumes at a failed scope-day's record
    # never given up: a batch skipped would put the ledger's shard progress past records never folded
    assert props.get("MaximumRetryAttempts", -1) == -1 and props.get("MaximumRecordAgeInSeconds", -1) == -1
    assert "DestinationConfig" not in props
    # a windowed event names its stream shard, which the ledger keeps its progress by
    assert props["TumblingWindowInSeconds"] == aggregation.USAGE_STREAM.tumbling_window_s > 0
    assert props["ParallelizationFactor"] == 1  # one batch at a time per shard: its progress has one writer


def test_the_audits_chunks_go_to_the_repair_queue_which_the_aggregator_drains(synth):
    """The audit's chunks are folded from the repair queue; a message that keeps failing
    lands in the aggregator's alarmed dead-letter queue."""
    repair_id = synth.id_of(synth.stack.usage_stream.repair_queue)
    dlq_id = synth.id_of(synth.stack.schedules.dead_letter_queues["aggregator"])
    queue = synth.json["Resources"][repair_id]["Properties"]
    assert referenced_ids(queue["RedrivePolicy"]) == {dlq_id} and queue["RedrivePolicy"]["maxReceiveCount"] == 5
    assert (
        queue["VisibilityTimeout"]
        >= 6 * synth.resources("AWS::Lambda::Function")[synth.function_ids()["aggregator"]]["Properties"]["Timeout"]
    )
    (sqs_mapping,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" not in m["Properties"]
    ]
    assert logical_id(sqs_mapping["EventSourceArn"]) == repair_id
    assert logical_id(sqs_mapping["FunctionName"]) == synth.function_ids()["aggregator"]
    assert sqs_mapping["ScalingConfig"]["MaximumConcurrency"] == 50
    assert sqs_mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]  # a failed message alone comes back
    env = synth.resources("AWS::Lambda::Function")[synth.function_ids()["aggregator"]]["Properties"]["Environment"]
    assert logical_id(env["Variables"]["REPAIR_QUEUE_URL"]) == repair_id
    role = synth.role_ids()["aggregator"]
    senders = [s for s in role_statements(synth.json)[role] if "sqs:SendMessage" in s.actions]
    assert senders and set().union(*(s.targets for s in senders)) == {repair_id, dlq_id}


def test_only_usage_markers_invoke_the_aggregator(synth):
    (markers,) = [json.loads(f["Pattern"]) for f in _mapping(synth)["FilterCriteria"]["Filters"]]
    assert (markers,) == aggregation.USAGE_STREAM_FILTERS
    assert markers["eventName"] == ["INSERT", "MODIFY"]  # not the TTL's deletions
    # markers only: not the label-days' index entries (DAY#) or the estimated items (ORG#...)
    assert markers["dynamodb"] == {"Keys": {"date_key": {"S": [{"prefix": "APP#"}]}}}


def test_only_the_aggregator_reads_the_stream(synth):
    stream = {"Fn::GetAtt": [synth.table_ids()[USAGE_AGG_SHARDED], "StreamArn"]}
    readers = {}
    for name, role_id in synth.role_ids().items():
        for statement in role_statements(synth.json)[role_id]:
            if stream in statement.resources:
                readers.setdefault(name, set()).update(statement.actions)
    assert readers == {"aggregator": {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"}}


def test_iterator_age_alarm(synth):
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()}
    alarm = alarms["price-keeper-dev-aggregator-iterator-age"]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == ("AWS/Lambda", "IteratorAge", "Maximum")
    assert referenced_ids(alarm["Dimensions"]) == {synth.function_ids()["aggregator"]}
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold" and 0 < alarm["Threshold"] <= 60_000
