"""Batch statistics of all the runs of one process, written together.

Every run used to count each batch in a transaction of its own, from a thread of its own: 32 jobs
under ``run_jobs`` wrote 32 ``job_stats`` transactions after every shared round, on up to 32 driver
connections, while the next round needed the same two cores (the driver's CPU per run of 32 jobs,
A/B: 1.41-1.82 s with them, 1.08-1.16 s with this queue; one job 0.63-0.71 -> 0.45-0.63 s).
Here one thread takes whatever has been queued, from any run, and writes it with
:func:`txn_offsets.store.stats.record_many`: one transaction per database and gathering, one row
per job.

Still best effort and still never on a batch's path: :func:`submit` only queues, and a failed write
is logged by ``record_many`` and reported as False on the records' futures. A run waits for its own
records when it ends (:func:`wait`), so its statistics are in the table once ``run_job`` returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from txn_offsets.store.handle import Store
from txn_offsets.store.stats import StatRecord, record_many

__all__ = ["WAIT_S", "WRITE_EVERY_S", "submit", "wait"]

logger = logging.getLogger(__name__)

# how long a run's end waits for its statistics: a write is bounded by the store's connect timeout
# and the statistics' own lock and statement timeouts (2 s, 5 s)
WAIT_S = 30.0
#: at most one write per this many seconds (what came meanwhile is summed into it), unless a run
#: that ends waits for its records: a write right after every batch took the driver's GIL and a
#: database connection while the next batch was being planned (plan p50 12.5 -> 11.6 ms with the
#: statistics off, its Kafka part 4.2 -> 1.8 ms, 8 partitions x 1,000 records per batch)
WRITE_EVERY_S = 0.5


@dataclass(frozen=True)
class _Queued:
    store: Store
    record: StatRecord
    done: Future[bool]


class _Writer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queued: list[_Queued] = []
        self._thread: threading.Thread | None = None
        self._last = float("-inf")  # when the last write began (monotonic)
        self._hurry = 0  # waiters for records still queued: write them now

    def submit(self, store: Store, record: StatRecord) -> Future[bool]:
        done: Future[bool] = Future()
        with self._cond:
            self._queued.append(_Queued(store, record, done))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="txn-offsets-stats", daemon=True)
                self._thread.start()
            self._cond.notify()
        return done

    def hurry(self, more: int) -> None:
        """A run waits for its records (`more` = +1), or no longer (-1): no pause between writes."""
        with self._cond:
            self._hurry += more
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while True:
                    pause = self._last + WRITE_EVERY_S - time.monotonic()
                    if self._queued and (pause <= 0 or self._hurry > 0):
                        break
                    self._cond.wait(pause if self._queued else None)
                taken, self._queued = self._queued, []
                self._last = time.monotonic()
            groups: dict[Store, list[_Queued]] = {}
            for item in taken:  # per engine (a pool of its own) and database settings
                groups.setdefault(item.store, []).append(item)
            for items in groups.values():
                try:
                    ok = record_many(items[0].store, [item.record for item in items])
                except Exception as exc:  # best effort; never let the thread die
                    logger.warning("batch statistics not recorded (%s)", type(exc).__name__)
                    ok = False
                for item in items:
                    item.done.set_result(ok)


_writer = _Writer()


def submit(store: Store, record: StatRecord) -> Future[bool]:
    """Queue `record` for the next write on `store`; the future says whether it was recorded."""
    return _writer.submit(store, record)


def wait(futures: Iterable[Future[bool]], timeout_s: float = WAIT_S) -> bool:
    """Wait (at most `timeout_s`) for queued records; whether all of them were recorded."""
    pending = list(futures)
    _writer.hurry(+1)
    try:
        done, late = concurrent.futures.wait(pending, timeout=timeout_s)
    finally:
        _writer.hurry(-1)
    if late:
        logger.warning("%d batch statistics still queued after %gs; not waiting longer", len(late), timeout_s)
    return not late and all(f.result() for f in done)
