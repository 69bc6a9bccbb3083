"""Which snapshot the jobs overview shows: never one read per page view.

A snapshot of 32 jobs x 4,096 partitions reads 131,072 rows (seconds on a busy machine); a scrape
of /metrics reads one anyway. So the overview shows the service's newest snapshot while it is as
fresh as the Kafka cache (``--kafka-cache-s``). An older one is refreshed in the background (one
refresh at a time, observed by the statuses as a scrape is) and the page waits up to ``wait_s``
for it: a small store shows the new one, a large one shows the previous one at once, its age on
the page. Only the very first page (no snapshot yet) waits for a read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from txn_offsets.service.console.history import LagHistory, RememberedStatuses
from txn_offsets.service.snapshot import Snapshot

__all__ = ["Current", "Freshness"]


@dataclass(frozen=True)
class Current:
    snapshot: Snapshot
    statuses: dict[str, str]  # as decided for that snapshot
    age_s: float


class Freshness:
    """Single-flight refreshes of the newest snapshot for the overview (thread-safe)."""

    def __init__(
        self,
        read: Callable[[], Snapshot],
        statuses: RememberedStatuses,
        history: LagHistory,
        *,
        fresh_s: float,
        wait_s: float = 1.0,
    ) -> None:
        self._read = read
        self._statuses = statuses
        self._history = history
        self.fresh_s = fresh_s
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._done: threading.Event | None = None  # set when the refresh in flight ends

    def _refresh(self, done: threading.Event) -> None:
        try:
            self._statuses.observe(self._read())  # the read keeps it in the history
        finally:
            with self._lock:
                self._done = None
            done.set()

    def _start(self) -> threading.Event:
        with self._lock:
            if self._done is None:
                self._done = threading.Event()
                threading.Thread(
                    target=self._refresh, args=(self._done,), name="console-snapshot", daemon=True
                ).start()
            return self._done

    def current(self) -> Current:
        got = self._history.latest()
        usable = got is not None and got[1].database_error is None
        if got is not None and usable and got[0] <= self.fresh_s:
            return self._known(*got)
        done = self._start()
        done.wait(None if not usable else self.wait_s)  # no snapshot to show yet: wait for one
        got = self._history.latest()
        if got is None:  # the read failed outside its own error handling
            return Current(Snapshot(database_error="the store could not be read (see the log)"), {}, 0.0)
        return self._known(*got)

    def _known(self, age: float, snap: Snapshot) -> Current:
        last = {j.job: self._statuses.last(j.job) for j in snap.jobs}
        return Current(snap, {job: s[0] for job, s in last.items() if s is not None}, age)
