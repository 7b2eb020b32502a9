"""Retries with exponential backoff and full jitter, honouring the server's Retry-After.

Only calls that are safe to repeat go through here: usage reports carry a ``request_id``
the server counts once, so resending after a lost answer cannot double-count.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import PriceKeeperError

log = logging.getLogger("price_keeper_client")
T = TypeVar("T")


@dataclass
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    max_retry_after: float = 60.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    jitter: Callable[[float, float], float] = field(default=random.uniform, repr=False)

    def delay(self, attempt: int, error: PriceKeeperError) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        if error.retry_after_seconds is not None:
            return min(error.retry_after_seconds, self.max_retry_after)
        return self.backoff(attempt)

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max_delay, base_delay * 2^(attempt-1))]."""
        return self.jitter(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))

    def call(self, operation: Callable[[], T], what: str = "request") -> T:
        """``operation()``, repeated on retryable errors (connection failures, 5xx, rate limits)."""
        attempt = 1
        while True:
            try:
                return operation()
            except PriceKeeperError as error:
                if not error.retryable or attempt >= self.attempts:
                    raise
                pause = self.delay(attempt, error)
                log.warning("%s failed (%s); retry %d/%d in %.2fs", what, error.code, attempt, self.attempts - 1, pause)
                self.sleep(pause)
                attempt += 1
