"""The quota rules, pure and in one place: percentages, statuses (NORMAL / TIGHT / EXCEEDED) and the selection
decision (docs/quotas.md, "The rules"). Model selection, the usage reply, aggregates and alerts all apply these, so
they can never disagree about what "spent" means. Sticky fallback keeps the *set* of labels a scope fell back past
today, shared by the apps of an ORG scope whatever their orderings.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

NORMAL, TIGHT, EXCEEDED = "NORMAL", "TIGHT", "EXCEEDED"
REASON_NORMAL = "NORMAL"
REASON_STICKY = "STICKY_FALLBACK"
REASON_ALL_EXCEEDED = "ALL_QUOTAS_EXCEEDED"
REASON_TOTAL_EXCEEDED = "TOTAL_QUOTA_EXCEEDED"
REASON_APP_EXCEEDED = "APP_QUOTA_EXCEEDED"


def quota_pct(spend: int, quota: int) -> float | None:
    """Spend as a percentage of quota, to one decimal (half up); None without a quota."""
    return (spend * 2000 + quota) // (2 * quota) / 10 if quota > 0 else None


def reached(spend: int, quota: int, pct: int) -> bool:
    """Spend is at or above ``pct`` % of quota (exact integer maths)."""
    return spend * 100 >= pct * quota


def quota_status(spend: int, quota: int, threshold_pct: int) -> str:
    if spend >= quota:
        return EXCEEDED
    if reached(spend, quota, threshold_pct):
        return TIGHT
    return NORMAL


class Sticky(NamedTuple):
    """A scope's sticky state of one org day: the labels it fell back past."""

    passed: frozenset[str]

    def applies_to(self, ordering: Sequence[str]) -> bool:
        """Whether it skips any label of ``ordering``."""
        return any(label in self.passed for label in ordering)


class Decision(NamedTuple):
    index: int | None  # position of the chosen label in the ordering; None: every label is spent
    label: str | None
    reason: str
    mode: str  # NORMAL | TIGHT of the chosen label
    sticky_active: bool
    newly_passed: frozenset[str]  # labels to add to the sticky state (spent, passed, not in it yet)


class Total(NamedTuple):
    """A scope's spend over every label of the day against its total cap."""

    spend: int
    quota: int


def first_unspent(
    ordering: Sequence[str], quotas: Mapping[str, int], spends: Mapping[str, int], passed: Collection[str] = ()
) -> int | None:
    """Position of the first label under its quota and not ``passed`` (no quota: spent); None when none is."""
    for i, label in enumerate(ordering):
        if label not in passed and int(spends.get(label, 0)) < int(quotas.get(label, 0)):
            return i
    return None


def decide(
    ordering: tuple[str, ...] | list[str],
    quotas: dict[str, int],
    spends: dict[str, int],
    threshold_pct: int,
    sticky_enabled: bool,
    sticky: Sticky | None,
    total: Total | None = None,
    app_total: Total | None = None,
) -> Decision:
    """The selection rules (pure). ``app_total``: the app's spend against its own cap in an ORG scope."""
    passed = sticky.passed if sticky_enabled and sticky else frozenset()
    sticky_applies = sticky_enabled and sticky is not None and sticky.applies_to(ordering)
    chosen = first_unspent(ordering, quotas, spends, passed)
    if chosen is None:
        return Decision(None, None, REASON_ALL_EXCEEDED, EXCEEDED, sticky_applies, frozenset())
    for cap, reason in ((total, REASON_TOTAL_EXCEEDED), (app_total, REASON_APP_EXCEEDED)):
        if cap is not None and cap.spend >= cap.quota:
            return Decision(None, None, reason, EXCEEDED, sticky_applies, frozenset())
    label = ordering[chosen]
    if chosen == 0:
        reason = REASON_NORMAL
    elif spends.get(ordering[chosen - 1], 0) < quotas.get(ordering[chosen - 1], 0):
        reason = REASON_STICKY  # the label before is available again, but the day stays past it
    else:
        reason = f"QUOTA_EXCEEDED_{ordering[chosen - 1].upper()}"
    newly_passed = frozenset(ordering[:chosen]) - passed if sticky_enabled else frozenset()
    # each of these is under its quota here (the label is unspent, a cap reached returned above)
    limits = [(spends.get(label, 0), quotas.get(label, 0)), *(cap for cap in (total, app_total) if cap is not None)]
    mode = TIGHT if any(reached(spend, quota, threshold_pct) for spend, quota in limits) else NORMAL
    return Decision(chosen, label, reason, mode, sticky_enabled and chosen > 0, newly_passed)
