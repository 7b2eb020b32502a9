"""The typed exceptions as the real local server produces them."""

from __future__ import annotations

import uuid

import pytest

from price_keeper_client import (
    Forbidden,
    InvalidConfig,
    InvalidRequest,
    NotFound,
    PriceKeeper,
    Provisioning,
    Unauthorized,
)

from .conftest import ORG_DEFAULTS, provision

pytestmark = pytest.mark.e2e


def test_unknown_label_is_invalid_config(server):
    with pytest.raises(InvalidConfig) as caught:
        server.provisioning().put_org(
            str(uuid.uuid4()), {**ORG_DEFAULTS, "model_ordering": ["no_such_label"], "quotas": {"no_such_label": 1}}
        )
    assert caught.value.status == 400 and caught.value.message


def test_app_of_unknown_org_is_not_found(server):
    with pytest.raises(NotFound) as caught:
        server.provisioning().put_app(str(uuid.uuid4()), "app-1", {"app_name": "x"})
    assert caught.value.status == 404


def test_wrong_provisioning_key_is_unauthorized(server):
    with pytest.raises(Unauthorized):
        Provisioning(server.url, "wrong-key").put_org(str(uuid.uuid4()), ORG_DEFAULTS)


def test_grace_period_out_of_range_is_invalid_request(server):
    org_id, _ = provision(server)
    with pytest.raises(InvalidRequest) as caught:
        server.provisioning().rotate(org_id, "app-1", grace_period_hours=169)
    assert caught.value.status == 400


def test_another_orgs_data_is_forbidden(server):
    _, creds = provision(server)
    other_org, _ = provision(server)
    keeper = PriceKeeper(server.url, creds.client_id, creds.client_secret, org_id=other_org)
    with pytest.raises(Forbidden) as caught:
        keeper.daily_spend()
    assert caught.value.status == 403
    assert keeper.close()
