"""A container's slices of a quota's headroom, leased as rate limits lease requests (``ratelimit``): the local state
only; ``reservations`` writes the ledgers. See docs/hard-cap.md, "Slices".

A *ledger set* is the ledgers one hold adds to, on one org day. A slice of its headroom is leased with one transaction
under the per-call hold's conditions, then holds are granted from it locally (one PutItem each); the ends of those
holds are kept as *pending* ledger deltas, netted into the container's next ledger write. Both are inside
``committed`` already: headroom this container keeps from the others, never headroom it may hand out twice, so a
container that dies leaks them (refusals early, never an overshoot).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from .. import state

LEASE_MIN_CALLS = 4  # a first slice: this many of the call's worst case
LEASE_MAX_CALLS = 32  # the largest slice: this many of the call's worst case
NEAR_PERCENT = 10  # the last 10 % of a cap is granted call by call
LEFT_SLICES = 64  # a slice is at most this fraction of what its ledgers have left
IDLE_SECS = 2.0  # a slice unused this long is given back, and refunds of a container idle this long
PENDING_SECS = 5.0  # refunds are written at least this often (netted into a lease before, if one comes)
MAX_AGE_SECS = 15.0  # a slice older than this grants nothing more (its rooms are read again)

# (org day, the set's ledger usage keys); a pending delta's key: (usage key, org day)
SetKey = tuple[str, tuple[str, ...]]
LedgerDay = tuple[str, str]


def add(into: dict[LedgerDay, list[int]], deltas: Mapping[LedgerDay, Sequence[int]]) -> None:
    """Add ledger deltas [committed, settled] into ``into`` (its lists only: ``deltas`` is left as it is)."""
    for ledger, (committed, settled) in deltas.items():
        total = into.setdefault(ledger, [0, 0])
        total[0] += committed
        total[1] += settled


@dataclass
class _Slice:
    free: int = 0  # leased, not granted yet
    fingerprint: tuple = ()  # the limits it was leased under: another limit, another slice
    leased_at: float = 0.0
    used_at: float = 0.0
    granted: int = 0  # granted from the slices leased since the last growth


@dataclass
class Claim:
    """What a ledger write takes out of a container to net: the set's free slice (given back
    to each of the set's ledgers) and pending deltas [committed, settled] by ledger-day."""

    key: SetKey | None
    free: int = 0
    deltas: dict[LedgerDay, list[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.free or any(any(delta) for delta in self.deltas.values()))

    def refunds(self) -> dict[LedgerDay, list[int]]:
        """The deltas to write: the pending ones, and the free slice off each of its set's ledgers."""
        refunds: dict[LedgerDay, list[int]] = {}
        add(refunds, self.deltas)
        if self.free and self.key is not None:
            day, usage_keys = self.key
            add(refunds, {(usage_key, day): (-self.free, 0) for usage_key in usage_keys})
        return refunds


class Slices:
    """One container's slices and pending refunds (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._sets: dict[SetKey, _Slice] = {}
        self._pending: dict[LedgerDay, list[int]] = {}
        self._pending_since: float | None = None
        self._active_at = 0.0  # this container's last hold on any set

    def reset(self) -> None:
        with self._lock:
            self._sets.clear()
            self._pending.clear()
            self._pending_since = None

    def take(self, key: SetKey, fingerprint: tuple, amount: int) -> bool:
        """Grant ``amount`` from the set's free slice when it covers it and was leased under
        the same limits, not too long ago."""
        now = self.clock()
        with self._lock:
            held = self._sets.get(key)
            if held is None or held.free < amount or held.fingerprint != fingerprint:
                return False
            if now - held.leased_at > MAX_AGE_SECS:
                return False
            held.free -= amount
            held.granted += amount
            held.used_at = self._active_at = now
            return True

    def next_size(self, key: SetKey, amount: int) -> int:
        """The next lease: the call alone when the container has held nothing on the set lately (a lone call leaves
        nothing behind, as ``ratelimit`` leases no more than was used), else twice what it held since, between
        ``LEASE_MIN_CALLS`` and ``LEASE_MAX_CALLS`` calls of ``amount``."""
        with self._lock:
            held = self._sets.get(key)
            granted = held.granted if held else 0
        if not granted:
            return amount
        return min(LEASE_MAX_CALLS * amount, max(LEASE_MIN_CALLS * amount, 2 * granted))

    def claim(self, key: SetKey | None) -> Claim:
        """Take the set's free slice and its ledgers' pending deltas (every pending delta, without
        a set) out, to net them into one write: ``unclaim`` when it was not applied."""
        with self._lock:
            held = self._sets.get(key) if key is not None else None
            free = held.free if held else 0
            if held:
                held.free = 0
            ledgers = list(self._pending) if key is None else [(usage_key, key[0]) for usage_key in key[1]]
            deltas = {ledger: self._pending.pop(ledger) for ledger in ledgers if ledger in self._pending}
            if not self._pending:
                self._pending_since = None
        return Claim(key, free, deltas)

    def unclaim(self, claim: Claim) -> None:
        """A write that was not applied (cancelled): what it claimed is back."""
        with self._lock:
            if claim.free and claim.key is not None:
                self._sets.setdefault(claim.key, _Slice()).free += claim.free
            self._add(claim.deltas)

    def leased(self, key: SetKey, fingerprint: tuple, size: int, granted: int) -> None:
        """A lease of ``size`` applied (a hold alone: ``size == granted``), ``granted`` of it
        held at once by the lease's own hold."""
        now = self.clock()
        with self._lock:
            held = self._sets.setdefault(key, _Slice())
            if held.fingerprint != fingerprint:
                held.granted = 0
            held.free += size - granted
            held.granted += granted
            held.fingerprint, held.leased_at, held.used_at = fingerprint, now, now
            self._active_at = now

    def defer(self, deltas: dict[LedgerDay, tuple[int, int]]) -> None:
        """Ledger deltas (committed, settled) of holds ended here, kept for a later write."""
        with self._lock:
            self._add(deltas)

    def _add(self, deltas: Mapping[LedgerDay, Sequence[int]]) -> None:
        add(self._pending, deltas)
        if self._pending and self._pending_since is None:
            self._pending_since = self.clock()

    def due(self, force: bool = False) -> list[Claim]:
        """What should be written back now (all when ``force``): each free slice unused for ``IDLE_SECS`` or leased
        ``MAX_AGE_SECS`` ago, and every pending delta once the oldest has waited ``PENDING_SECS``, or ``IDLE_SECS`` in
        a container that held nothing for as long (one that only settles, or went quiet)."""
        now = self.clock()
        claims = []
        with self._lock:
            for key, held in self._sets.items():
                idle = force or now - held.used_at >= IDLE_SECS
                if held.free and (idle or now - held.leased_at >= MAX_AGE_SECS):
                    if idle:
                        held.granted = 0
                    claims.append(Claim(key, held.free))
                    held.free = 0
            waited = now - self._pending_since if self._pending_since is not None else None
            flush = waited is not None and (
                force or waited >= PENDING_SECS or (waited >= IDLE_SECS and now - self._active_at >= IDLE_SECS)
            )
        if flush:
            claims.append(self.claim(None))
        return [claim for claim in claims if claim]

    def held(self) -> tuple[int, dict[LedgerDay, list[int]]]:
        """(free slices, pending deltas): what this container keeps (tests, benchmarks)."""
        with self._lock:
            return sum(held.free for held in self._sets.values()), {k: list(v) for k, v in self._pending.items()}


DEFAULT = Slices()
state.kept(DEFAULT.reset)
_current: ContextVar[Slices | None] = ContextVar("hold_slices", default=None)


def current() -> Slices:
    return _current.get() or DEFAULT


@contextmanager
def container(slices: Slices) -> Iterator[Slices]:
    """Run the block as the container ``slices`` (a benchmark's thread, a test)."""
    token = _current.set(slices)
    try:
        yield slices
    finally:
        _current.reset(token)
