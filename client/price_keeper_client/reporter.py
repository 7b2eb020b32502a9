"""Usage reporting: at once with retries, or through a background queue in batches.

Every retry resends the same ``request_id``, which the service counts once, so a report
whose answer was lost is resent without double-counting. The background queue sends
whatever has accumulated (up to 100 records, the batch limit) as soon as the previous
batch is answered, so batches grow with the caller's throughput without a fixed delay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from .errors import ERRORS_BY_CODE, PriceKeeperError
from .models import BatchResult, LabelQuota, ScopeTotal, UsageReceipt, UsageRecord
from .retry import RetryPolicy
from .spool import Spool

log = logging.getLogger("price_keeper_client")

BATCH_LIMIT = 100
_RETRYABLE_ITEM_ERRORS = frozenset(code for code, cls in ERRORS_BY_CODE.items() if cls.retryable)


class UsageReporter:
    """``send_one(record) -> UsageReceipt`` and ``send_batch(records) -> BatchResult`` do the HTTP;
    ``on_quota`` hears every label's quota position a usage answer reports (single or batch),
    ``on_total`` every position of the scope's total.

    With a ``spool`` (see ``spool.py``) every queued record is on disk until the service has
    counted it, and records the service could not take (unreachable, after the retries) are
    not given up: they wait ``redeliver_after`` seconds and are sent again, until it returns."""

    def __init__(
        self,
        send_one: Callable[[UsageRecord], UsageReceipt],
        send_batch: Callable[[Sequence[UsageRecord]], BatchResult],
        *,
        retry: RetryPolicy | None = None,
        batch_size: int = BATCH_LIMIT,
        max_pending: int = 100_000,
        on_quota: Callable[[LabelQuota], None] | None = None,
        on_total: Callable[[ScopeTotal], None] | None = None,
        spool: Spool | None = None,
        redeliver_after: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        if not 1 <= batch_size <= BATCH_LIMIT:
            raise ValueError(f"batch_size must be 1..{BATCH_LIMIT}")
        self._send_one = send_one
        self._send_batch = send_batch
        self.retry = retry or RetryPolicy()
        self.batch_size = batch_size
        self.max_pending = max_pending
        self._on_quota = on_quota
        self._on_total = on_total
        self.spool = spool
        self.redeliver_after = redeliver_after
        self._monotonic = monotonic
        self._held: list[UsageRecord] = []  # (spool) unreachable service: sent again at _held_until
        self._held_until = 0.0
        self._pending: deque[UsageRecord] = deque()
        self._in_flight = 0
        self._closing = False
        self._worker: threading.Thread | None = None
        self._cond = threading.Condition()
        #: Records the service refused (not retryable, e.g. an unknown label), with the error code.
        self.rejected: list[tuple[UsageRecord, str]] = []
        #: Records still unsent after every retry (the service unreachable); resend them later.
        self.undelivered: list[UsageRecord] = []

    # -- at once -----------------------------------------------------------------------------

    def report(self, record: UsageRecord) -> UsageReceipt:
        """Sends one record now, retrying transient failures with the same ``request_id``."""
        receipt = self.retry.call(lambda: self._send_one(record), "usage report")
        self._heard([receipt.quota] if receipt.quota else [], [receipt.total] if receipt.total else [])
        return receipt

    def report_batch(self, records: Iterable[UsageRecord]) -> list[BatchResult]:
        """Sends records in batches of at most 100, each retried as a whole on transient failures."""
        records = list(records)
        results = [
            self.retry.call(lambda chunk=records[i : i + self.batch_size]: self._send_batch(chunk), "usage batch")
            for i in range(0, len(records), self.batch_size)
        ]
        self._heard(
            [quota for result in results for quota in result.quotas],
            [result.total for result in results if result.total],
        )
        return results

    def _heard(self, quotas: list[LabelQuota], totals: list[ScopeTotal]) -> None:
        if self._on_quota:
            for quota in quotas:
                self._on_quota(quota)
        if self._on_total:
            for total in totals:
                self._on_total(total)

    # -- background ----------------------------------------------------------------------------

    def submit(self, record: UsageRecord) -> None:
        """Queues a record for the background sender (started on first use)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("reporter is closed")
            if len(self._pending) >= self.max_pending:
                raise OverflowError(f"{self.max_pending} usage records already waiting; is the service reachable?")
            if self.spool is not None:
                self.spool.add([record])
            self._pending.append(record)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="price-keeper-reporter", daemon=True)
                self._worker.start()
            self._cond.notify_all()

    def resume(self, records: list[UsageRecord]) -> None:
        """Queues records already in the spool (adopted from a dead keeper's file)."""
        with self._cond:
            self._pending.extend(records)
            if records and self._worker is None:
                self._worker = threading.Thread(target=self._run, name="price-keeper-reporter", daemon=True)
                self._worker.start()
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending) + self._in_flight + len(self._held)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every queued record has been sent (or given up on). False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._in_flight and not self._held, timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flushes the queue and stops the sender. False if records were left unsent."""
        flushed = self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
        if self.spool is not None:
            self.spool.close()  # what is left in it is sent by the next keeper on the directory
        return flushed and not self.undelivered

    def _next_batch(self) -> list[UsageRecord] | None:
        with self._cond:
            while True:
                if self._held and (self._closing or self._monotonic() >= self._held_until):
                    if self._closing:  # left in the spool for the next keeper
                        self._held.clear()
                        self._cond.notify_all()
                    self._pending.extend(self._held)
                    self._held.clear()
                if self._pending or self._closing:
                    break
                self._cond.wait(max(0.0, self._held_until - self._monotonic()) if self._held else None)
            if not self._pending:
                return None
            batch = [self._pending.popleft() for _ in range(min(self.batch_size, len(self._pending)))]
            self._in_flight = len(batch)
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._deliver(batch)
            except Exception:  # never let the sender thread die with records waiting
                log.exception("usage batch failed")
                self._give_up(batch)
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()

    def _deliver(self, batch: list[UsageRecord]) -> None:
        """Sends a batch; records the service failed individually with a transient error are
        resent (after a backoff) until the retry policy's attempts are used up."""
        if self.spool is not None:
            self.spool.sync()
        for attempt in range(1, self.retry.attempts + 1):
            try:
                (result,) = self.report_batch(batch)
            except PriceKeeperError as error:
                if error.retryable:
                    log.error("%d usage records undelivered after retries: %s", len(batch), error.code)
                    self._give_up(batch)
                else:
                    log.error("%d usage records refused: %s", len(batch), error.code)
                    self.rejected.extend((record, error.code) for record in batch)
                    self._finished(record.request_id for record in batch)
                return
            by_id = {record.request_id: record for record in batch}
            batch = []
            for item in result.results:
                if item.accepted or item.request_id not in by_id:
                    continue
                if item.error in _RETRYABLE_ITEM_ERRORS:
                    batch.append(by_id[item.request_id])
                else:
                    self.rejected.append((by_id[item.request_id], item.error or "FAILED"))
            self._finished(set(by_id) - {record.request_id for record in batch})
            if not batch:
                return
            if attempt < self.retry.attempts:
                self.retry.sleep(self.retry.backoff(attempt))
        self._give_up(batch)

    def _finished(self, request_ids) -> None:
        if self.spool is not None:
            self.spool.done(request_ids)

    def _give_up(self, batch: list[UsageRecord]) -> None:
        """Records the service could not take now: kept for later (``undelivered``), or with
        a spool held and sent again after ``redeliver_after``."""
        if self.spool is None:
            self.undelivered.extend(batch)
            return
        with self._cond:
            self._held.extend(batch)
            self._held_until = self._monotonic() + self.redeliver_after
