"""The service's own memory for the console: each job's lag at every snapshot the service reads
(a scrape of /metrics or /offsets, a console page), kept for ``keep_s`` (an hour), one a
``every_s`` per job, for the lag-over-time charts; the newest snapshot itself (what the overview
shows: :mod:`~txn_offsets.service.console.fresh`); and the status last decided. Lost at a
restart, as the status trend is."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from txn_offsets.service.snapshot import Snapshot
from txn_offsets.service.status import JobStatuses, StatusRules

__all__ = ["LagHistory", "RememberedStatuses", "Sample"]

Sample = tuple[float, int]  # (epoch seconds, lag in records)


class LagHistory:
    """Thread-safe; forgets the jobs a snapshot no longer shows."""

    def __init__(
        self, *, keep_s: float = 3600.0, every_s: float = 1.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.keep_s = keep_s
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._lags: dict[str, deque[Sample]] = {}
        self._latest: tuple[float, Snapshot] | None = None  # (monotonic time, snapshot)

    def record(self, snap: Snapshot) -> None:
        """Keep `snap` as the newest; a sample per job whose lag Kafka answered for (none while it
        does not)."""
        self._latest = (time.monotonic(), snap)
        if snap.database_error is not None or (snap.kafka is not None and snap.kafka.error is not None):
            return
        now = self._clock()
        limit = int(self.keep_s / max(self.every_s, 1.0)) + 2
        with self._lock:
            self._lags = {j.job: self._lags.get(j.job) or deque(maxlen=limit) for j in snap.jobs}
            for j in snap.jobs:
                if not j.partitions:
                    continue
                samples = self._lags[j.job]
                if samples and now - samples[-1][0] < self.every_s:
                    samples[-1] = (samples[-1][0], j.total_lag)  # the newest figure within the step
                else:
                    samples.append((now, j.total_lag))
                while samples and now - samples[0][0] > self.keep_s:
                    samples.popleft()

    def latest(self) -> tuple[float, Snapshot] | None:
        """The newest snapshot and its age in seconds (None: none yet)."""
        got = self._latest
        return None if got is None else (time.monotonic() - got[0], got[1])

    def samples(self, job: str) -> list[Sample]:
        with self._lock:
            return list(self._lags.get(job, ()))


class RememberedStatuses(JobStatuses):
    """:class:`JobStatuses` that also keeps the last state decided per job (and when)."""

    def __init__(self, rules: StatusRules | None = None) -> None:
        super().__init__(rules)
        self._last: dict[str, tuple[str, float]] = {}

    def observe(self, snap: Snapshot) -> dict[str, str]:
        out = super().observe(snap)
        if snap.database_error is None:
            now = time.time()
            self._last = {job: (state, now) for job, state in out.items()}
        return out

    def last(self, job: str) -> tuple[str, float] | None:
        """The job's last state and when it was decided (epoch seconds); None: not yet."""
        return self._last.get(job)
