"""Slices of a quota's headroom (docs/hard-cap.md, "Slices") over moto, through the real
domain calls: far from the cap a container leases a slice with one ledger transaction and
grants holds from it with a PutItem each; the ends of those holds are netted into its next
ledger write, exactly once; near the cap each call is held alone, so the cap is used to
within one call's worst case; several containers never overshoot, and a dead one leaks
only headroom. Each "container" is a ``slices.Slices`` of its own."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime

import pytest
from botocore.exceptions import EndpointConnectionError

from price_keeper import bodies
from price_keeper.bodies import UsageRequest
from price_keeper.domain import metering, reservations, slices
from price_keeper.errors import ApiError
from price_keeper.store import dynamo, keys, tables
from price_keeper.store import reservations as store_reservations
from price_keeper.store.dynamo import table
from price_keeper.timeutil import org_day
from tests.usage_support import new_tenant, usage_body

CALL = {"max_input_tokens": 1000, "max_output_tokens": 1000}
WORST = 4000  # 1000 input + 1000 output tokens of premium: 800 + 3200 micro-USD
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


def tenant(quota: int):
    return new_tenant(model_ordering=("premium",), quotas={"premium": quota})


def reserve(t, kept: slices.Slices) -> dict | None:
    """A reservation as container ``kept`` makes it: its body, None when refused (429)."""
    with slices.container(kept):
        try:
            return reservations.reserve(t.org_id, t.app_id, bodies.ReservationRequest(**CALL))
        except ApiError as error:
            assert (error.status, error.code) == (429, "QUOTA_EXCEEDED")
            return None


def settle(t, kept: slices.Slices, held: dict, share: float = 0.5) -> int:
    """The call's usage reported to container ``kept`` (``share`` of the worst case): its cost."""
    tokens = int(CALL["max_input_tokens"] * share)
    body = usage_body(input_tokens=tokens, output_tokens=tokens, reservation_id=held["reservation_id"])
    with slices.container(kept):
        reply = metering.submit(t.org_id, t.app_id, UsageRequest.model_validate(body))
    assert reply["reservation"]["settled"] is True
    return reply["processing"]["cost_usd_micros"]


def ledger(t) -> dict:
    day = org_day("America/New_York", datetime.now(UTC))
    found = table(tables.DAILY_TOTAL).get_item(
        Key={"usage_key": keys.usage_key(t.scope, "premium"), "date_key": keys.ledger_day_key(day)}
    )
    return {name: int(found.get("Item", {}).get(name, 0)) for name in ("committed", "settled")}


def ledger_adds(calls: list[tuple[str, dict]]) -> list[int]:
    """The ``committed`` ADD of each ledger transaction on the label's ledger, in order."""
    return [
        int(update[":c"]["N"] if isinstance(update[":c"], dict) else update[":c"])
        for name, params in calls
        if name == "TransactWriteItems"
        for action in params["TransactItems"]
        if "Update" in action and "#LABEL#premium" in str(action["Update"]["Key"])
        for update in [action["Update"]["ExpressionAttributeValues"]]
    ]


def test_holds_from_a_slice_write_no_ledger(api, dynamodb_calls):
    t, kept = tenant(1000 * WORST), slices.Slices()
    assert reserve(t, kept) is not None  # the first is held alone: a lone call leaves nothing behind
    assert reserve(t, kept) is not None  # the second leases 4 calls' worth (its own hold among them)
    leased = (1 + slices.LEASE_MIN_CALLS) * WORST
    assert ledger(t) == {"committed": leased, "settled": 0}
    dynamodb_calls.clear()
    for _ in range(slices.LEASE_MIN_CALLS - 1):
        assert reserve(t, kept) is not None
    writes = [(name, params) for name, params in dynamodb_calls if name in WRITES]
    assert [name for name, _ in writes] == ["PutItem"] * (slices.LEASE_MIN_CALLS - 1)
    assert {params["TableName"] for _, params in writes} == {tables.STICKY_STATE.physical_name}
    assert ledger(t)["committed"] == leased  # no ledger write
    dynamodb_calls.clear()
    assert reserve(t, kept) is not None  # the slice is used up: the next is twice what it held
    assert ledger_adds(dynamodb_calls) == [2 * leased]


def test_refunds_net_into_the_next_lease_and_are_written_once(api, dynamodb_calls):
    t, kept = tenant(1000 * WORST), slices.Slices()
    held = [reserve(t, kept) for _ in range(1 + slices.LEASE_MIN_CALLS)]  # one alone, then a slice's
    costs = [settle(t, kept, hold) for hold in held]
    leased, alone = (1 + slices.LEASE_MIN_CALLS) * WORST, WORST - costs[0]
    # the lone hold's settlement wrote its ledger, as ever; the slice's holds' wrote none
    assert ledger(t) == {"committed": leased - alone, "settled": costs[0]}
    refunds = sum(WORST - cost for cost in costs[1:])
    dynamodb_calls.clear()
    assert reserve(t, kept) is not None
    assert ledger_adds(dynamodb_calls) == [2 * leased - refunds]  # one transaction: the lease, net
    assert ledger(t) == {"committed": 3 * leased - alone - refunds, "settled": sum(costs)}
    assert kept.held() == (2 * leased - WORST, {})  # nothing pending: no second write of them
    reservations.flush(kept, force=True)  # the rest of the slice given back, nothing else
    assert ledger(t) == {"committed": sum(costs) + WORST, "settled": sum(costs)}


class Dynamo:
    """The service's client, with DynamoDB's rule for a repeated ClientRequestToken (a
    transaction applied under a token is answered again as applied, and not applied again),
    which moto does not keep; ``lose`` answers of netting writes are lost after they were
    applied, then the store stays unreachable for ``down`` more calls."""

    def __init__(self, client, lose: int = 0, down: int = 0):
        self.client, self.lose, self.down = client, lose, down
        self.applied: set[str] = set()
        self.tokens: list[str] = []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def transact_write_items(self, **kwargs):
        token = kwargs.get("ClientRequestToken")
        netting = not any("Put" in action for action in kwargs["TransactItems"])
        if netting:
            self.tokens.append(token)
            if token in self.applied:
                if self.down:
                    self.down -= 1
                    raise EndpointConnectionError(endpoint_url="https://dynamodb")
                return {}  # DynamoDB: the same token again is answered, not applied
        reply = self.client.transact_write_items(**kwargs)
        self.applied.add(token)
        if netting and self.lose:
            self.lose -= 1
            raise EndpointConnectionError(endpoint_url="https://dynamodb")  # applied; its answer lost
        return reply


@pytest.mark.parametrize("down", [0, 10], ids=["answered-on-the-retry", "never-answered"])
def test_a_netting_write_sent_again_is_applied_once_and_its_refunds_never_netted_again(api, monkeypatch, down):
    """A write of refunds whose answer is lost is sent again under its token (DynamoDB then
    applies it at most once); one that stays unanswered is given up, and its refunds are not
    netted again into a later write (they may be in: a second time would be an overshoot)."""
    monkeypatch.setattr(dynamo, "_backoff", lambda attempt: None)
    t, kept = tenant(1000 * WORST), slices.Slices()
    held = [reserve(t, kept) for _ in range(slices.LEASE_MIN_CALLS - 1)]
    costs = [settle(t, kept, hold) for hold in held]
    refunds = sum(WORST - cost for cost in costs[1:])  # (the first was held alone: written at once)
    before, rest = ledger(t), kept.held()[0]  # (rest: the slice's calls not held)
    client = Dynamo(dynamo.ddb_client(), lose=1, down=down)
    monkeypatch.setattr(dynamo, "ddb_client", lambda: client)
    reservations.flush(kept, force=True)  # the idle flush: one write of the refunds and the slice's rest
    assert len(set(client.tokens)) == 1  # one token, sent again: the first applied, its answer lost
    assert len(client.tokens) == min(2 + down, store_reservations.UNSURE_ATTEMPTS)
    assert ledger(t) == {"committed": before["committed"] - refunds - rest, "settled": sum(costs)}
    assert kept.held() == (0, {})  # given up or written: never kept for another write
    monkeypatch.setattr(dynamo, "ddb_client", lambda: client.client)
    assert reserve(t, kept) is not None
    reservations.flush(kept, force=True)
    assert ledger(t) == {"committed": sum(costs) + WORST, "settled": sum(costs)}  # each refund once


def test_near_the_cap_calls_are_held_one_by_one_and_the_cap_is_used_to_one_worst_case(api):
    quota = 60 * WORST + 1234
    t, kept, rng = tenant(quota), slices.Slices(), random.Random(7)
    spent, alone = 0, []
    while (held := reserve(t, kept)) is not None:
        hold = table(tables.STICKY_STATE).get_item(
            Key=reservations.ReservationId.parse(held["reservation_id"]).key(t.org_id, t.app_id)
        )["Item"]
        alone.append(not hold.get(reservations.FROM_SLICE))
        spent += settle(t, kept, held, rng.uniform(0.4, 1.0))
    first_alone = alone.index(True, 1)  # (the very first is held alone: nothing held before it)
    assert all(alone[first_alone:])  # once near the cap, every call was held on its own
    assert sum(alone) >= quota // 10 // WORST  # the last 10 % of the cap (at least) call by call
    assert quota - WORST < spent <= quota  # used to within one call's worst case, never past it
    reservations.flush(kept, force=True)
    assert ledger(t) == {"committed": spent, "settled": spent}


def _container_loop(t, kept: slices.Slices, seed: int, spent: list[int], lock: threading.Lock) -> None:
    rng, refusals = random.Random(seed), 0
    while refusals < 3:
        held = reserve(t, kept)
        if held is None:
            refusals += 1
            continue
        refusals = 0
        cost = settle(t, kept, held, rng.uniform(0.4, 1.0))
        with lock:
            spent.append(cost)


@pytest.mark.slow  # volume: hundreds of calls; make test and CI run it
def test_several_containers_never_overshoot(api):
    quota = 150 * WORST
    t = tenant(quota)
    fleet = [slices.Slices() for _ in range(6)]
    spent: list[int] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=_container_loop, args=(t, kept, n, spent, lock)) for n, kept in enumerate(fleet)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(spent) <= quota  # 0 overshoot
    for kept in fleet:  # the containers go idle: what they kept is written back
        reservations.flush(kept, force=True)
    assert ledger(t) == {"committed": sum(spent), "settled": sum(spent)}
    _container_loop(t, fleet[0], 99, spent, lock)  # the last one then fills the cap to one worst case
    assert quota - WORST < sum(spent) <= quota


@pytest.mark.slow  # volume: hundreds of calls; make test and CI run it
def test_a_dead_containers_slice_and_refunds_leak_only_headroom(api):
    quota = 300 * WORST  # (a slice is at most 1/64 of what is left: 4 calls' worth fit)
    t, dead, alive = tenant(quota), slices.Slices(), slices.Slices()
    first, second = reserve(t, dead), reserve(t, dead)  # the second leased a slice
    spent = [settle(t, dead, first, 0.5), settle(t, dead, second, 0.5)]
    free, pending = dead.held()
    label_key = next(ledger for ledger in pending if "#LABEL#" in ledger[0])
    kept_back = free - pending[label_key][0]  # its unused slice and its refund: both still in committed
    assert kept_back == slices.LEASE_MIN_CALLS * WORST - spent[1]
    dead_cost = spent[1]  # settled spend it had not written to the ledger yet
    del dead  # the container ends without writing them back
    _container_loop(t, alive, 1, spent, threading.Lock())
    reservations.flush(alive, force=True)
    assert sum(spent) <= quota  # never an overshoot
    assert quota - WORST - kept_back < sum(spent) <= quota - kept_back  # only its headroom is lost
    assert ledger(t) == {"committed": sum(spent) + kept_back, "settled": sum(spent) - dead_cost}
