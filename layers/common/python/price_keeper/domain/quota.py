"""The quota rules, pure and in one place: percentages, statuses (NORMAL / TIGHT /
EXCEEDED) and the selection decision. Model selection, the usage reply, aggregates and
alerts all apply these, so they can never disagree about what "spent" means.

- The choice is the first label in ``model_ordering`` whose spend is under its quota,
  at or after the day's sticky label (sticky fallback: the choice only moves forward
  during an org day; ``STICKY_FALLBACK`` when an earlier label would be available again).
- Tight mode: the chosen label's spend, or the scope's total, is at or above
  ``tight_mode_threshold_pct`` of its quota.
- Every label spent, or the scope's total cap reached: no label (429 ``QUOTA_EXCEEDED``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

NORMAL, TIGHT, EXCEEDED = "NORMAL", "TIGHT", "EXCEEDED"
REASON_NORMAL = "NORMAL"
REASON_STICKY = "STICKY_FALLBACK"
REASON_ALL_EXCEEDED = "ALL_QUOTAS_EXCEEDED"
REASON_TOTAL_EXCEEDED = "TOTAL_QUOTA_EXCEEDED"


def exceeded_reason(label: str) -> str:
    return f"QUOTA_EXCEEDED_{label.upper()}"


def quota_pct(spend: int, quota: int) -> float | None:
    """Spend as a percentage of quota, to one decimal (half up); None without a quota."""
    if quota <= 0:
        return None
    tenths = (spend * 2000 + quota) // (2 * quota)
    return tenths / 10


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
    label: str
    index: int


class Decision(NamedTuple):
    index: int | None  # position of the chosen label in the ordering; None: every label is spent
    label: str | None
    reason: str
    mode: str  # NORMAL | TIGHT of the chosen label
    sticky_active: bool
    flip_to: int | None  # StickyState index to write (the choice moved forward)


class Total(NamedTuple):
    """A scope's spend over every label of the day against its total cap."""

    spend: int
    quota: int


def sticky_floor(ordering: Sequence[str], sticky_label: str | None) -> int:
    """Where the day's choice stands at least: the sticky label's position (0 without one,
    or when the label has left the ordering)."""
    return list(ordering).index(sticky_label) if sticky_label in ordering else 0


def first_unspent(
    ordering: Sequence[str], quotas: Mapping[str, int], spends: Mapping[str, int], floor: int = 0
) -> int | None:
    """Position of the first label at or after ``floor`` still under its quota (a label
    without a quota is always spent); None when every one is spent. Every label before it,
    from ``floor`` on, has fallen back to its successor."""
    return next(
        (i for i in range(floor, len(ordering)) if int(spends.get(ordering[i], 0)) < int(quotas.get(ordering[i], 0))),
        None,
    )


def decide(
    ordering: tuple[str, ...] | list[str],
    quotas: dict[str, int],
    spends: dict[str, int],
    threshold_pct: int,
    sticky_enabled: bool,
    sticky: Sticky | None,
    total: Total | None = None,
) -> Decision:
    """The selection rules (pure). ``spends`` may omit labels with no spend yet."""

    def spend(label: str) -> int:
        return spends.get(label, 0)

    floor = sticky_floor(ordering, sticky.label if sticky_enabled and sticky else None)
    chosen = first_unspent(ordering, quotas, spends, floor)
    if chosen is None:
        return Decision(None, None, REASON_ALL_EXCEEDED, EXCEEDED, sticky_enabled and floor > 0, None)
    if total is not None and total.spend >= total.quota:
        return Decision(None, None, REASON_TOTAL_EXCEEDED, EXCEEDED, sticky_enabled and floor > 0, None)
    label = ordering[chosen]
    if chosen == 0:
        reason = REASON_NORMAL
    elif chosen == floor and first_unspent(ordering, quotas, spends) < floor:  # not None: chosen is unspent
        reason = REASON_STICKY  # an earlier label is available again, but the day stays
    else:
        reason = exceeded_reason(ordering[chosen - 1])
    flip_to = chosen if sticky_enabled and chosen > floor else None
    tight = quota_status(spend(label), quotas.get(label, 0), threshold_pct) == TIGHT or (
        total is not None and quota_status(total.spend, total.quota, threshold_pct) == TIGHT
    )
    mode = TIGHT if tight else NORMAL
    return Decision(chosen, label, reason, mode, sticky_enabled and chosen > 0, flip_to)
