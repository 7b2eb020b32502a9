"""cdk-nag's ``AwsSolutions`` rule pack on the app, and the findings the stack keeps on purpose.

cdk-nag 3 runs as a CDK validation plugin: every finding, warning or error, fails the synth
(``make synth``, ``Template.from_stack`` in the tests) and is listed in
``cdk.out/validation-report.json``. What the pack found and the stack fixed: point-in-time
recovery on every table (``storage.py``) and execution logging on the API stage
(``api.py``). What it keeps is acknowledged below, each on the one resource it concerns
(never on a parent that would cover others), with the reason.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from price_keeper import routes
from price_keeper.routes import Auth

from . import access
from .api import HttpApi, RestApi
from .functions import traced
from .price_keeper_stack import PriceKeeperStack

# The ARNs of ``functions.Functions._grant_aws_apis`` as cdk-nag renders them in a finding id.
INFERENCE_PROFILES = "arn:<AWS::Partition>:bedrock:*:<AWS::AccountId>:inference-profile/*"
APPLICATION_INFERENCE_PROFILES = "arn:<AWS::Partition>:bedrock:*:<AWS::AccountId>:application-inference-profile/*"
FOUNDATION_MODELS = "arn:<AWS::Partition>:bedrock:*::foundation-model/*"
API_GATEWAY_LOGS_POLICY = "arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs"

NO_AUTHORIZER = (
    "No API Gateway authorizer: the service is its own OAuth2 issuer (client credentials), so a "
    "Cognito user pool (COG4) neither issues nor knows its tokens, and every request must be "
    "checked against the revocation list and the client's cutoff in DynamoDB (auth.py), which "
    "an authorizer's cached answer would skip. The request pipeline (pipeline.admit) "
    "authenticates before the body is parsed. This route: "
)
ROUTE_AUTH = {
    Auth.NONE: "public by design (health, the OpenAPI document, the docs and console pages).",
    Auth.CLIENT: "an OAuth2 token endpoint; the function authenticates the client by its id and "
    "secret (bcrypt), which is what issues the token an authorizer would want.",
    Auth.PROVISIONING_KEY: "the function compares the X-API-Key provisioning key in constant time.",
    Auth.BEARER: "the function verifies the service's JWT, checks revocation and matches the "
    "token's org and app to the path.",
    Auth.BEARER_ANY: "the function verifies the service's JWT and checks revocation; the token names the client.",
}


def _acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    """Accept one finding on the CloudFormation resource of ``construct`` (its default child),
    by the id the synth prints (``<pack>::<rule>``; without the pack CDK files it as an annotation)."""
    target = construct.node.default_child or construct
    Validations.of(target).acknowledge(Acknowledgment(id=f"AwsSolutions::AwsSolutions-{rule}", reason=reason))


def acknowledge(stack: PriceKeeperStack) -> None:
    """Every finding the stack keeps, on the resource it concerns, with its reason."""
    _acknowledge(
        stack.jwt_secret,
        "SMG4",
        "The service signs and verifies every token with this one HS256 key (no key id), so a "
        "scheduled rotation would end every live access and refresh token at once. It is "
        "rotated by hand when needed (put-secret-value; warm functions read it within 5 minutes).",
    )
    _acknowledge(
        stack.provisioning_secret,
        "SMG4",
        "The operators' admin key, which they read from Secrets Manager by hand: a scheduled "
        "rotation would change it under them. It is rotated by hand (put-secret-value; warm "
        "functions honour the new key within 5 minutes).",
    )

    for name, function in stack.functions.by_name.items():
        _acknowledge(
            function,
            "L1",
            "The runtime is pinned with the AWS-managed Powertools layer variant (python312) and "
            "the layer's precompiled byte code (stacks/settings.py: RUNTIME, PYTHON_VERSION); "
            "Python 3.12 is a supported Lambda runtime, and moving all three is a deliberate "
            "upgrade, not a lint fix.",
        )
        policy = function.role.node.find_child("DefaultPolicy")
        stars = [
            grant
            for grant, given in (
                (
                    "X-Ray (Tracing.ACTIVE: xray:PutTraceSegments, xray:PutTelemetryRecords)",
                    traced(stack.settings, name),
                ),
                ("the Price List API (pricing:GetProducts)", name in access.PRICE_LIST_READERS),
                (
                    "CloudWatch's metric reads (cloudwatch:GetMetricData, ListMetrics)",
                    name in access.BEDROCK_METRICS_READERS,
                ),
                ("Cost Explorer's GetCostAndUsage", name in access.COST_EXPLORER_READERS),
            )
            if given
        ]
        if stars:
            _acknowledge(policy, "IAM5[Resource::*]", ", ".join(stars) + ": AWS accepts only Resource '*' for these.")
        if name in access.INFERENCE_PROFILE_READERS:
            profiles = (
                "Tenants register inference profiles at run time and a profile is resolved in the "
                "region its ARN names: any profile of this account, in any region, read-only "
                "(bedrock:GetInferenceProfile)."
            )
            _acknowledge(policy, f"IAM5[Resource::{INFERENCE_PROFILES}]", profiles)
            _acknowledge(policy, f"IAM5[Resource::{APPLICATION_INFERENCE_PROFILES}]", profiles)
        if name in access.FOUNDATION_MODEL_READERS:
            _acknowledge(
                policy,
                f"IAM5[Resource::{FOUNDATION_MODELS}]",
                "The fetcher looks up the name of whichever model the Price List or an "
                "UNPRICED_MODEL event names, in any region; foundation models are AWS's (no "
                "account in the ARN) and bedrock:GetFoundationModel only reads their description.",
            )

    if isinstance(stack.api, HttpApi):
        _acknowledge_http_api(stack.api)
    else:
        _acknowledge_rest_api(stack.api)
    if stack.api.access_logs is None:
        stage = stack.api.stage if isinstance(stack.api, HttpApi) else stack.api.api.deployment_stage
        _acknowledge(
            stage,
            "APIG1",
            "Access logs switched off by the deployer (accessLogs=false): at about 0.35 KB a request "
            "they are about $227 a month at 1,000 requests/s (docs/performance.md); the functions' "
            "own logs keep every refusal and the audited routes' lines.",
        )

    repair_dlq = stack.usage_stream.repair_queue.dead_letter_queue.queue  # cdk-nag recognises that one
    for job, queue in stack.schedules.dead_letter_queues.items():
        if queue is repair_dlq:
            continue
        _acknowledge(
            queue,
            "SQS3",
            f"This queue is the dead-letter queue of {job}'s schedule (EventBridge target DLQ "
            "and Lambda on-failure destination); cdk-nag only recognises queues that are another "
            "queue's DLQ.",
        )


NO_WAF = (
    "No WAF: a web ACL costs more per month than the rest of this service; stage "
    "throttling and the per-client rate limits of the authenticated routes (config.yaml "
    "rate_limits) bound the load, and every route but the public pages authenticates "
    "its caller."
)


def _acknowledge_http_api(gateway: HttpApi) -> None:
    for route, http_route in zip(routes.ROUTES, gateway.routes, strict=True):
        _acknowledge(http_route, "APIG4", NO_AUTHORIZER + ROUTE_AUTH[route.auth])
    _acknowledge(
        gateway.unmatched,
        "APIG4",
        NO_AUTHORIZER + "the $default route, which only answers 404 NOT_FOUND for requests no route matches.",
    )


def _acknowledge_rest_api(gateway: RestApi) -> None:
    api = gateway.api
    _acknowledge(
        api.node.find_child("CloudWatchRole"),
        f"IAM4[Policy::{API_GATEWAY_LOGS_POLICY}]",
        "The account-level role API Gateway writes access and execution logs with; AWS's managed "
        "policy is the one documented for it, and an inline copy would need the same log "
        "wildcards without AWS's updates.",
    )
    _acknowledge(
        api,
        "APIG2",
        "Each function validates its body against the schema the OpenAPI document publishes "
        "(pydantic, answering the api_spec error schema with the failing field), after "
        "authenticating the caller; a gateway validator would need a second copy of every "
        "schema and would answer unauthenticated callers first, in its own words.",
    )
    _acknowledge(api.deployment_stage, "APIG3", NO_WAF)
    for route, method in zip(routes.ROUTES, gateway.methods, strict=True):
        reason = NO_AUTHORIZER + ROUTE_AUTH[route.auth]
        _acknowledge(method, "APIG4", reason)
        _acknowledge(method, "COG4", reason)


def check(app: App, stack: PriceKeeperStack) -> None:
    """The ``AwsSolutions`` pack on ``app``, with the stack's acknowledged findings."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    acknowledge(stack)
