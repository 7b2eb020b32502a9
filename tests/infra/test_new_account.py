"""A first deploy on any account, a failed create that rolls back clean, and a bill with no
surprises (docs/infrastructure.md, "First deploy"): reserved concurrency only where the
account has room, money tables ``RetainExceptOnCreate`` with deletion protection off on a
first create, the alert topic publishable by its own rule alone, tracing and access logs
where they pay."""

from __future__ import annotations

import pytest

from price_keeper import routes
from price_keeper.store.tables import ALL_TABLES
from stacks.functions import UNRESERVED_MINIMUM, reserved_concurrency
from stacks.settings import Settings

from .cfn import logical_id
from .conftest import build

pytestmark = pytest.mark.infra
RESERVED = {"aggregator": 100, "model_selection": 200}


def reserved(synth) -> dict[str, int]:
    functions = synth.resources("AWS::Lambda::Function")
    return {
        name: functions[function_id]["Properties"]["ReservedConcurrentExecutions"]
        for name, function_id in synth.function_ids().items()
        if "ReservedConcurrentExecutions" in functions[function_id]["Properties"]
    }


def test_a_plain_synth_and_a_small_account_reserve_nothing(synth, synth_new_account):
    """Lambda accepts a reservation only while 100 executions stay unreserved, and new
    accounts start at 10 or 50: a reservation there failed the whole first deploy."""
    assert reserved(synth) == {}  # the account's limit unknown (a plain ``cdk deploy``)
    assert reserved(synth_new_account) == {}  # 50


def test_an_account_with_room_reserves_for_the_fold_and_the_choice(synth_options):
    """A burst of one tenant on the API cannot take the account's whole concurrency from the
    fold or the choice."""
    assert reserved(synth_options) == RESERVED
    assert 1000 - sum(RESERVED.values()) >= UNRESERVED_MINIMUM


@pytest.mark.parametrize(
    ("reserve", "limit", "expected"),
    [
        ("auto", None, {}),
        ("auto", 10, {}),
        ("auto", 50, {}),
        ("auto", 399, {}),
        ("auto", 400, RESERVED),
        ("auto", 1000, RESERVED),
        ("false", 1000, {}),
        ("true", None, RESERVED),
        ("true", 1000, RESERVED),
    ],
)
def test_reservations_follow_the_accounts_room(reserve, limit, expected):
    assert reserved_concurrency(Settings(reserve_concurrency=reserve, account_concurrency=limit)) == expected


def test_forced_reservations_on_a_small_account_are_refused_with_a_clear_message(tmp_path):
    with pytest.raises(ValueError, match="account's limit is 50 and Lambda keeps 100 unreserved"):
        build(tmp_path / "cdk.out", reserveConcurrency="true", accountConcurrency="50")


def test_money_tables_are_retained_except_when_their_create_fails(synth, synth_new_account):
    """A create that fails after the tables exist deleted nothing (``Retain``), and the next
    deploy of the stage failed on their names. ``RetainExceptOnCreate`` deletes what the
    failed create made; deletion protection, which DynamoDB enforces against that rollback
    too, is off on a first create and on after it."""
    for spec in ALL_TABLES:
        for synthesized, protected in ((synth, spec.holds_money), (synth_new_account, False)):
            table = synthesized.json["Resources"][synthesized.table_ids()[spec]]
            if spec.holds_money:
                assert (table["DeletionPolicy"], table["UpdateReplacePolicy"]) == ("RetainExceptOnCreate", "Retain")
            else:
                assert table["DeletionPolicy"] == "Delete", spec.name
            assert table["Properties"].get("DeletionProtectionEnabled", False) is protected, spec.name


def test_only_the_alert_rule_may_publish_to_the_topic_through_eventbridge(synth):
    """The topic policy CDK wrote let ``events.amazonaws.com`` publish with no
    ``aws:SourceArn`` condition (any rule, of any account). The rule publishes with a role of
    its own instead, which EventBridge alone may assume, and the topic policy names no
    EventBridge principal."""
    topic_id = synth.id_of(synth.stack.alerts.topic)
    for policy in synth.resources("AWS::SNS::TopicPolicy").values():
        principals = [s.get("Principal") for s in policy["Properties"]["PolicyDocument"]["Statement"]]
        assert {"Service": "events.amazonaws.com"} not in principals
    (target,) = synth.json["Resources"][synth.id_of(synth.stack.alerts.rule)]["Properties"]["Targets"][:1]
    assert logical_id(target["Arn"]) == topic_id
    role = synth.json["Resources"][logical_id(target["RoleArn"])]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "events.amazonaws.com"}


def test_tracing_where_it_pays_and_everywhere_when_asked(synth, synth_options):
    """Active tracing of every function is ~$700 a month at 1,000 requests/s: by default the
    jobs alone (a few runs a minute); ``tracing=all`` traces every function."""
    for synthesized, everywhere in ((synth, False), (synth_options, True)):
        functions = synthesized.resources("AWS::Lambda::Function")
        for name, function_id in synthesized.function_ids().items():
            mode = functions[function_id]["Properties"].get("TracingConfig", {}).get("Mode")
            assert mode == ("Active" if everywhere or name in routes.JOBS else None), name


def test_access_logs_are_infrequent_access_and_optional(synth, synth_new_account):
    (stage,) = synth.resources("AWS::ApiGatewayV2::Stage").values()
    group = synth.json["Resources"][logical_id(stage["Properties"]["AccessLogSettings"]["DestinationArn"])]
    assert group["Properties"]["LogGroupClass"] == "INFREQUENT_ACCESS"
    (stage,) = synth_new_account.resources("AWS::ApiGatewayV2::Stage").values()
    assert "AccessLogSettings" not in stage["Properties"]
