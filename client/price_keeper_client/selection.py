"""Which model to call, cached for as long as the service says the answer holds.

The service's ``client_guidance.cache_duration_secs`` (300 s in normal mode, 60 s in tight
mode) and the ``Cache-Control: max-age`` header bound the cache; the shorter wins. The
cache is dropped at once when the service answers 429, and when a usage answer (single or
batch) shows the label spent or turned tight, or a reason the cached choice does not know,
or the scope's total (over every label, against its total cap) spent or turned tight.

A client that reports usage keeps the cache fresh without selection requests of its own:
once less than half of a choice's life is left, the next report asks for the selection
with it (``?model_selection=true``) and the answer's selection replaces the cached one.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from .errors import PriceKeeperError
from .models import CarriedSelection, LabelQuota, ModelChoice, ScopeTotal

_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*(\d+)", re.IGNORECASE)
_NO_STORE = re.compile(r"(?:^|[,\s])(no-store|no-cache)(?:$|[,\s])", re.IGNORECASE)
RENEW_AT_SHARE_LEFT = 0.5  # a report asks for the selection once less than this share of the choice's life is left
RENEW_LEAD_SECS = 5.0  # ...and less than this, or two gaps between reports, is left (a busy client asks once a life)
ASK_AGAIN_AFTER_SECS = 10.0  # an ask whose answer never came back (the report failed) is given up after this


def cache_seconds(choice: ModelChoice, cache_control: str | None) -> float:
    """How long ``choice`` may be reused: the shorter of the guidance and ``max-age``."""
    if cache_control and _NO_STORE.search(cache_control):
        return 0.0
    seconds = float(choice.cache_duration_secs)
    match = _MAX_AGE.search(cache_control or "")
    if match:
        seconds = min(seconds, float(match.group(1)))
    return max(0.0, seconds)


class ModelSelector:
    """Caches ``GET .../model-selection``; ``fetch(force)`` returns ``(choice, cache_control)``."""

    def __init__(
        self, fetch: Callable[[bool], tuple[ModelChoice, str | None]], *, clock: Callable[[], float] = time.monotonic
    ):
        self._fetch = fetch
        self.clock = clock
        self._choice: ModelChoice | None = None
        self._expires_at = 0.0
        self._lifetime = 0.0
        self._asked_at: float | None = None
        self._last_report_at: float | None = None
        self._lock = threading.Lock()

    def current(self, force: bool = False) -> ModelChoice:
        """The cached choice while it holds, else a fresh one. Raises ``QuotaExceeded`` when
        every label is spent (and asks again on the next call)."""
        with self._lock:
            if not force and self._choice is not None and self.clock() < self._expires_at:
                return self._choice
            try:
                choice, cache_control = self._fetch(force)
            except PriceKeeperError as error:
                if error.status == 429:
                    self._choice = None
                raise
            self._keep(choice, cache_seconds(choice, cache_control))
            return choice

    def _keep(self, choice: ModelChoice, seconds: float) -> None:
        self._choice, self._lifetime = choice, seconds
        self._expires_at = self.clock() + seconds

    def ask_with_report(self) -> bool:
        """Whether the report about to be sent should ask for the selection: a choice is
        cached (the client selects) with less than half of its life left, and no more than
        two gaps between reports (or ``RENEW_LEAD_SECS``, whichever is longer), so the next
        report may come too late; and no other report's ask is still unanswered. A client
        reporting every ~86 s asks with every other report; one reporting many times a
        second asks once a life, as often as it used to select. ``True`` counts as the ask:
        answer it with ``renew``."""
        with self._lock:
            now = self.clock()
            gap = now - self._last_report_at if self._last_report_at is not None else self._lifetime
            self._last_report_at = now
            if self._asked_at is not None and now - self._asked_at < ASK_AGAIN_AFTER_SECS:
                return False
            lead = min(self._lifetime * RENEW_AT_SHARE_LEFT, max(2 * gap, RENEW_LEAD_SECS))
            due = self._choice is not None and self._expires_at - now < lead
            if due:
                self._asked_at = now
            return due

    def renew(self, carried: CarriedSelection | None) -> None:
        """Takes the selection a usage answer carried: the new cached choice, or, when every
        label is spent, no choice (the next ``current`` asks and raises ``QuotaExceeded``)."""
        with self._lock:
            self._asked_at = None
            if carried is None:
                return
            if carried.choice is None:
                self._choice = None
            else:
                self._keep(carried.choice, cache_seconds(carried.choice, None))

    @property
    def cached(self) -> ModelChoice | None:
        with self._lock:
            return self._choice if self._choice is not None and self.clock() < self._expires_at else None

    def invalidate(self) -> None:
        with self._lock:
            self._choice = None

    def observe(self, quota: LabelQuota | None) -> None:
        """Feeds back the quota position a usage answer reported for the cached label: the
        next call selects again when the label is spent, turned tight, or the reason changed.
        (Not when it reads NORMAL under a TIGHT choice: the choice may be tight for the scope's
        total cap, which a usage answer does not evaluate, and a tight choice is short-lived.)"""
        if quota is None:
            return
        with self._lock:
            choice = self._choice
            if choice is None or (quota.label and quota.label != choice.label):
                return
            worse = quota.status == "EXCEEDED" or (quota.status == "TIGHT" and choice.mode != "TIGHT")
            if worse or (quota.reason and quota.reason != choice.reason):
                self._choice = None

    def observe_total(self, total: ScopeTotal | None) -> None:
        """Feeds back the scope's total a usage answer reported: the next call selects again
        when the total cap is passed, or turned tight under a NORMAL choice (which the label's
        own position never shows while other labels, or this one, spend the total)."""
        if total is None:
            return
        with self._lock:
            choice = self._choice
            if choice is not None and (
                total.status == "EXCEEDED" or (total.status == "TIGHT" and choice.mode != "TIGHT")
            ):
                self._choice = None
