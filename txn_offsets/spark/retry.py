"""Retrying a run's loop after a transient failure: the batch runner and the low-latency epochs
plan again from the stored offsets after a Transient error (ServiceUnavailable, a lost commit
outcome, ...), up to ``retries`` times in a row, waiting ``retry_backoff_s * 2**(n-1)`` seconds
(at most :data:`MAX_DELAY_S`) before the n-th; a success resets the count. A stop ends the wait."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from txn_offsets.errors import Transient

__all__ = ["MAX_DELAY_S", "TransientRetries"]

logger = logging.getLogger(__name__)

#: The longest wait between two attempts.
MAX_DELAY_S = 30.0


@dataclass
class TransientRetries:
    """The consecutive transient failures of one run's loop (`then`: what the loop does next, for
    the warning: "planning again from the stored offsets")."""

    job: str
    retries: int
    backoff_s: float
    stop: threading.Event
    then: str = "planning again from the stored offsets"
    failures: int = field(default=0, init=False)

    def delay(self) -> float:
        """The wait before the next attempt, after `failures` failures in a row."""
        return min(MAX_DELAY_S, self.backoff_s * 2.0 ** (self.failures - 1))

    def wait_after(self, exc: Transient) -> None:
        """Count `exc`; re-raise it once the retries are used up, else warn and wait (a stop ends
        the wait early: the loop sees the stop next)."""
        self.failures += 1
        if self.failures > self.retries:
            raise exc
        delay = self.delay()
        logger.warning(
            "job=%r transient failure (%s); %s in %.1fs (retry %d of %d)",
            self.job,
            exc,
            self.then,
            delay,
            self.failures,
            self.retries,
        )
        self.stop.wait(delay)

    def succeeded(self) -> None:
        self.failures = 0
