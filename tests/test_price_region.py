"""The region whose price a label reported without ``calling_region`` gets: the stack's own
(Lambda's ``AWS_REGION``), not us-east-1 wherever the stack runs."""

from __future__ import annotations

import pytest

from price_keeper.domain import pricing

pytestmark = pytest.mark.unit


def test_the_default_price_region_is_the_functions_region(monkeypatch):
    monkeypatch.delenv("DEFAULT_PRICE_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert pricing.default_price_region() == "eu-west-1"


def test_an_explicit_default_price_region_wins(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("DEFAULT_PRICE_REGION", "us-west-2")
    assert pricing.default_price_region() == "us-west-2"


def test_outside_lambda_it_is_us_east_1(monkeypatch):
    monkeypatch.delenv("DEFAULT_PRICE_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert pricing.default_price_region() == "us-east-1"
