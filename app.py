#!/usr/bin/env python3
"""CDK app: ``npx cdk synth`` / ``npx cdk deploy`` (``make synth`` / ``make deploy``).

Settings come from CDK context (``cdk.json``, ``-c key=value``); see ``stacks/settings.py``.
"""

from __future__ import annotations

import os

import aws_cdk as cdk

from stacks import nag
from stacks.price_keeper_stack import PriceKeeperStack
from stacks.settings import Settings

# China regions (aws-cn): AWS publishes no Powertools layer there and the Price List API of
# that partition is another service; the stack is for the aws partition (GovCloud untested).
UNSUPPORTED_REGION_PREFIXES = ("cn-",)


def build(app: cdk.App) -> PriceKeeperStack:
    """The stack of the stage named in the app's context, checked by cdk-nag's
    ``AwsSolutions`` pack when it is synthesized (``stacks/nag.py``)."""
    settings = Settings.from_context(app.node)
    region = settings.region or os.environ.get("CDK_DEFAULT_REGION")
    if region and region.startswith(UNSUPPORTED_REGION_PREFIXES):
        raise ValueError(
            f"region {region}: the aws partition only (the Powertools layers and the "
            "Price List API the stack uses are not in aws-cn)"
        )
    env = cdk.Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=region) if region else None
    stack = PriceKeeperStack(app, f"PriceKeeper-{settings.stage}", settings=settings, env=env)
    cdk.Tags.of(stack).add("service", "bedrock-price-keeper")
    cdk.Tags.of(stack).add("stage", settings.stage)
    nag.check(app, stack)
    return stack


if __name__ == "__main__":
    cdk_app = cdk.App()
    build(cdk_app)
    cdk_app.synth()
