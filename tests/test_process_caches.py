"""Per-process memory stays bounded whatever clients send: a made-up
region is refused before any AWS client exists for it, and every cache a warm container
keeps has a bound. Handlers on moto; the local stack's Bedrock stand-in for profiles."""

from __future__ import annotations

import functools
import importlib
import itertools
import pkgutil
import string

import pytest

import price_keeper
from price_keeper import aws
from price_keeper.aws import bedrock as bedrock_control_plane
from price_keeper.cache import TTLCache
from price_keeper.domain import pricing
from tests.conftest import assert_error
from tests.test_profiles import bedrock, register  # noqa: F401 - bedrock: the stand-in fixture
from tests.usage_support import new_tenant, usage_body


@pytest.fixture
def tenant(api):
    return new_tenant()


def bogus_regions(count: int) -> list[str]:
    """Region names of the right shape that no AWS partition has (``zz-aaaa-1`` ...)."""
    names = ("".join(letters) for letters in itertools.product(string.ascii_lowercase, repeat=4))
    return [f"zz-{name}-{count % 10}" for name, count in zip(names, range(count), strict=False)]


def test_profiles_naming_made_up_regions_are_400_and_create_no_client(api, tenant):
    bedrock_control_plane.bedrock_client.cache_clear()
    for region in bogus_regions(300):
        arn = f"arn:aws:bedrock:{region}:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
        body = assert_error(register(api, tenant, "p1", arn=arn), 400, "INVALID_REQUEST")
        assert body["message"] == f"Invalid inference profile ARN: unknown AWS region {region}"
    assert bedrock_control_plane.bedrock_client.cache_info().currsize == 0


def test_a_region_of_another_partition_is_unknown_too(api, tenant):
    arn = "arn:aws:bedrock:cn-north-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0"
    assert_error(register(api, tenant, "p1", arn=arn), 400, "INVALID_REQUEST")
    assert bedrock_control_plane.bedrock_client.cache_info().currsize == 0


def test_usage_naming_a_made_up_calling_region_is_400_and_reads_no_price(api, tenant):
    pricing._stored.clear()
    reply = api.post(tenant.app_path + "/usage", usage_body(calling_region="zz-aaaa-1"), token=tenant.token)
    body = assert_error(reply, 400, "INVALID_REQUEST")
    assert body["details"] == {"calling_region": "zz-aaaa-1"}
    assert pricing._stored._data == {}


def test_no_bedrock_client_is_built_for_an_unknown_region():
    with pytest.raises(ValueError, match="unknown AWS region"):
        bedrock_control_plane.bedrock_client("zz-aaaa-1")
    assert bedrock_control_plane.bedrock_client.cache_info().currsize == 0


def _process_caches() -> dict[str, object]:
    """Every module-level cache of the layer: ``functools`` caches and ``TTLCache``s."""
    found, seen = {}, set()
    for module_info in pkgutil.walk_packages(price_keeper.__path__, "price_keeper."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            defined_here = isinstance(value, TTLCache) or getattr(value, "__module__", None) == module.__name__
            if defined_here and id(value) not in seen and (isinstance(value, TTLCache) or hasattr(value, "cache_info")):
                seen.add(id(value))
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_process_cache_of_the_layer_is_bounded():
    caches = _process_caches()
    # the ones this issue is about are among them (the walk finds caches)
    assert {
        "price_keeper.aws.bedrock.bedrock_client",
        "price_keeper.domain.profiles._routing",
        "price_keeper.domain.pricing._stored",
        "price_keeper.aws.client",
    } <= set(caches)
    unbounded = [
        name
        for name, cache in caches.items()
        if (cache.max_entries if isinstance(cache, TTLCache) else cache.cache_info().maxsize) is None
    ]
    assert unbounded == []


def test_a_full_ttl_cache_keeps_its_bound_and_its_newest_entries():
    """A warm container serving more tenants than the bound evicts the entry put longest
    ago, one at a time: the tenants it served lately stay warm (it used to drop them all)."""
    cache = TTLCache(60, max_entries=3)
    for key in range(10):
        cache.put(key, key)
        assert len(cache._data) <= 3
    assert [cache.get(key) for key in range(6, 10)] == [None, 7, 8, 9]
    cache.put(7, "again")  # put again: the newest now
    cache.put(10, 10)
    assert [cache.get(key) for key in (7, 8, 9, 10)] == ["again", None, 9, 10]


def test_known_region_clients_are_reused_within_the_bound():
    assert aws.client.cache_info().maxsize is not None
    first = bedrock_control_plane.bedrock_client("us-east-1")
    assert bedrock_control_plane.bedrock_client("us-east-1") is first
    assert isinstance(bedrock_control_plane.bedrock_client, functools._lru_cache_wrapper)
