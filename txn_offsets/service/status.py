"""Each job's status, Burrow-style, from what the store and Kafka say and how the lag moved between
scrapes.

The states, the first rule that holds wins:

* ``OUT_OF_LOG``: a stored offset is outside the log, below its start (deleted before it was
  processed) or past its end (a forced reset, another incarnation of the topic): the job's next
  plan finds data loss there (``DataLoss``, or an audited skip). Needs Kafka's answer.
* ``FENCED``: the job's ``fenced`` or ``conflict`` counter (``job_stats``) went up within the last
  ``fenced_hold_s``, as seen by this service between two scrapes: a run was fenced by a newer run
  or found its offsets moved under it (a zombie driver, two schedulers, a reset during a run).
* ``STOPPED``: no run holds a live lease (none started, it ended, or its driver died and the lease
  ran out).
* ``STALLED``: a live run, and a partition with lag whose stored offset has not moved for
  ``stall_after_s``: the run holds the lease but commits nothing there (Burrow's STALL).
* ``LAGGING``: a live run that commits, but whose total lag grew over the trend window: every
  scrape of the last ``trend_window_s`` saw lag, each at least the one before, the last more than
  the first (Burrow's WARN: it cannot keep up).
* ``OK``: anything else.

Without Kafka's answer (``txn_offsets_up{target="kafka"} 0``) only FENCED and STOPPED can be
decided; otherwise the job has no status until Kafka answers again. FENCED and LAGGING depend on
this service's own memory of earlier scrapes: after a restart they need a scrape or two again.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from txn_offsets.errors import ConfigError
from txn_offsets.service.snapshot import JobView, Snapshot

__all__ = ["STATES", "JobStatuses", "StatusRules"]

#: Every state, in the order the rules are tried (OK last).
STATES = ("OUT_OF_LOG", "FENCED", "STOPPED", "STALLED", "LAGGING", "OK")
_FENCINGS = ("fenced", "conflict")
_SAMPLES = 256  # lag samples kept per job (many scrapers within one trend window)


@dataclass(frozen=True)
class StatusRules:
    """The thresholds of the status rules (seconds)."""

    stall_after_s: float = 600.0
    trend_window_s: float = 600.0
    fenced_hold_s: float = 900.0

    def __post_init__(self) -> None:
        for name in ("stall_after_s", "trend_window_s", "fenced_hold_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(name, f"{value!r}: give a number of seconds > 0")


@dataclass
class _Seen:
    lags: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    fencings: int | None = None
    fenced_at: float | None = None


class JobStatuses:
    """Decides the status of every job of a snapshot and remembers what it needs of earlier
    scrapes (the lag trend, the fencing counters). Thread-safe; forgets jobs that disappear."""

    def __init__(self, rules: StatusRules | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = rules or StatusRules()
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}

    def observe(self, snap: Snapshot) -> dict[str, str]:
        """job -> state, for the jobs whose state can be decided (see the module's docstring)."""
        if snap.database_error is not None:
            return {}
        kafka_ok = snap.kafka is None or snap.kafka.error is None
        now = self._clock()
        out: dict[str, str] = {}
        with self._lock:
            self._seen = {j.job: self._seen.get(j.job) or _Seen() for j in snap.jobs}
            for j in snap.jobs:
                state = self._decide(j, self._seen[j.job], now, kafka_ok)
                if state is not None:
                    out[j.job] = state
        return out

    def _decide(self, j: JobView, seen: _Seen, now: float, kafka_ok: bool) -> str | None:
        rules = self.rules
        fencings = sum(j.stats.outcomes.get(name, 0) for name in _FENCINGS) if j.stats else 0
        if seen.fencings is not None and fencings > seen.fencings:
            seen.fenced_at = now
        seen.fencings = fencings
        if kafka_ok:
            seen.lags.append((now, j.total_lag))
        while seen.lags and now - seen.lags[0][0] > rules.trend_window_s:
            seen.lags.popleft()
        # admin/lag's own flag: `txn-offsets offsets lag` and the service always agree
        if kafka_ok and any(p.out_of_log for p in j.partitions):
            return "OUT_OF_LOG"
        if seen.fenced_at is not None and now - seen.fenced_at < rules.fenced_hold_s:
            return "FENCED"
        if not j.live:
            return "STOPPED"
        return self._progress(j, seen) if kafka_ok else None

    def _progress(self, j: JobView, seen: _Seen) -> str:
        """STALLED, LAGGING or OK: a live run, with Kafka's answer."""
        if any(
            p.lag > 0
            and (p.topic, p.partition) in j.stored
            and j.stored[(p.topic, p.partition)].last_commit_age_s >= self.rules.stall_after_s
            for p in j.partitions
        ):
            return "STALLED"
        lags = [lag for _at, lag in seen.lags]
        growing = all(b >= a for a, b in itertools.pairwise(lags))
        if len(lags) >= 2 and min(lags) > 0 and growing and lags[-1] > lags[0]:
            return "LAGGING"
        return "OK"
