"""A function per HTTP function and job: code, runtime, layers, environment."""

from __future__ import annotations

import json

import pytest

from price_keeper import routes
from price_keeper.store.tables import ALL_TABLES
from stacks import LAMBDAS_DIR, REPO_ROOT, access
from stacks.functions import FUNCTIONS

from .cfn import logical_id, referenced_ids

pytestmark = pytest.mark.infra


def _function(synth, name: str) -> dict:
    return synth.json["Resources"][synth.function_ids()[name]]["Properties"]


def test_a_function_per_http_function_and_job(synth):
    assert set(FUNCTIONS) == set(routes.HTTP_FUNCTIONS) | set(routes.JOBS)
    names = {p["Properties"].get("FunctionName") for p in synth.resources("AWS::Lambda::Function").values()}
    assert {f"price-keeper-dev-{name.replace('_', '-')}" for name in FUNCTIONS} <= names


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_has_a_handler(name):
    """The stack deploys lambdas/<name> for every listed function."""
    assert (LAMBDAS_DIR / name / "handler.py").is_file(), f"lambdas/{name}/handler.py is missing"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_runtime_architecture_tracing_and_layers(synth, name):
    props = _function(synth, name)
    assert props["Runtime"] == "python3.12"
    assert props["Architectures"] == ["arm64"]
    # X-Ray where a trace pays: the jobs' few runs a minute, not every API request (``tracing``)
    assert props.get("TracingConfig") == ({"Mode": "Active"} if name in routes.JOBS else None)
    logging = props["LoggingConfig"]
    assert (logging["LogFormat"], logging["ApplicationLogLevel"], logging["SystemLogLevel"]) == ("JSON", "INFO", "WARN")
    expected_handler = "docs/handler.lambda_handler" if name == "docs" else "handler.lambda_handler"
    assert props["Handler"] == expected_handler
    common, powertools = props["Layers"]
    assert logical_id(common) in synth.resources("AWS::Lambda::LayerVersion")
    # The layer of the Powertools version the tests run: its ARN, from AWS's public SSM
    # parameter of that version, resolved at deploy.
    parameter = synth.json["Parameters"][logical_id(powertools)]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
    assert parameter["Default"] == f"/aws/service/powertools/python/arm64/python3.12/{PINNED_POWERTOOLS}"


def _pinned_powertools() -> str:
    """The version requirements.txt pins, read apart from stacks/layer.py's reading of it."""
    text = (REPO_ROOT / "requirements.txt").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("aws-lambda-powertools")]
    return line.split("==")[1].strip()


PINNED_POWERTOOLS = _pinned_powertools()


def test_the_powertools_the_tests_import_is_the_pinned_one():
    import aws_lambda_powertools

    assert aws_lambda_powertools.__version__ == PINNED_POWERTOOLS


def test_a_fixed_powertools_layer_version_overrides_the_pin():
    """-c powertoolsLayerVersion=N: for a version whose SSM parameter AWS has not published."""
    import aws_cdk as cdk

    from stacks.layer import SharedLayers
    from stacks.settings import Settings

    stack = cdk.Stack(cdk.App(), "Layers", env=cdk.Environment(region="eu-west-1"))
    layers = SharedLayers(stack, "Layers", Settings(powertools_layer_version=40, bundle_layer=False))
    arn = json.dumps(stack.resolve(layers.powertools.layer_version_arn))
    assert ":017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-arm64:40" in arn


def test_shared_layer_matches_runtime_and_architecture(synth):
    (layer,) = synth.resources("AWS::Lambda::LayerVersion").values()
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_environment(synth, name):
    env = _function(synth, name)["Environment"]["Variables"]
    assert env["POWERTOOLS_SERVICE_NAME"] == "price-keeper"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "BedrockPriceKeeper"
    assert env["POWERTOOLS_LOG_LEVEL"] == "INFO"
    table_ids = synth.table_ids()
    wanted = {spec.env: table_ids[spec] for spec in access.tables_of(name)}
    present = {spec.env: logical_id(env[spec.env]) for spec in ALL_TABLES if spec.env in env}
    assert present == wanted
    jwt_id, provisioning_id = synth.id_of(synth.stack.jwt_secret), synth.id_of(synth.stack.provisioning_secret)
    assert ("JWT_SECRET_NAME" in env) == (name in access.JWT_READERS)
    if "JWT_SECRET_NAME" in env:
        assert referenced_ids(env["JWT_SECRET_NAME"]) == {jwt_id}
    assert ("PROVISIONING_SECRET_NAME" in env) == (name in access.PROVISIONING_READERS)
    if "PROVISIONING_SECRET_NAME" in env:
        assert referenced_ids(env["PROVISIONING_SECRET_NAME"]) == {provisioning_id}
    assert ("EVENT_BUS_NAME" in env) == (name in access.ALERT_PUBLISHERS)


def test_every_function_logs_to_its_own_group_with_retention(synth):
    groups = synth.resources("AWS::Logs::LogGroup")
    for name in FUNCTIONS:
        logging = _function(synth, name)["LoggingConfig"]
        group = groups[logical_id(logging["LogGroup"])]["Properties"]
        assert group["LogGroupName"] == f"/aws/lambda/price-keeper-dev-{name.replace('_', '-')}"
        assert group["RetentionInDays"] == 30


def test_timeouts_fit_the_api_and_the_schedule(synth):
    for name in routes.HTTP_FUNCTIONS:
        assert _function(synth, name)["Timeout"] <= 29  # API Gateway's integration limit
    assert _function(synth, "aggregator")["Timeout"] < 60  # one run per minute must not overlap


def test_a_china_region_is_refused_at_synth(tmp_path):
    """aws-cn is not supported (no Powertools layer, another Price List): said at synth, not mid-deploy."""
    from .conftest import build

    with pytest.raises(ValueError, match="aws partition only"):
        build(tmp_path / "cdk.out", region="cn-north-1")
