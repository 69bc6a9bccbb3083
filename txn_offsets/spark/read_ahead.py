"""Reading ahead: a BatchWriter's next batch computed while the driver commits this one.

A BatchWriter's batch is a Spark job (the user's compute over the batch's records) and then the
commit on the driver (claim + the user's write + COMMIT + the proof), in series: while the driver
commits, Spark's cores wait. A 320,000-record batch of the bench: compute 0.79 s, commit 0.33 s.
While a job catches up, its next batch is known before this one commits (``plan_next``: the next
ranges start where this batch's end), so its compute can run meanwhile.

The guard is untouched: the next batch's claim still needs ``off = from``, so it commits only after
this one did, and only the batch the run loop plans next is ever taken (the same plan, the same
number). A computed batch is dropped - its Spark job cancelled, its result never written - when
this batch fails, when the next step plans afresh, or when the run ends. Computes never overlap one
another (a user's compute may use a fixed temp view name); one runs beside the previous batch's
``write`` and ``on_batch``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from txn_offsets.plan.planner import Plan
from txn_offsets.spark import session
from txn_offsets.spark.batch import Batch

__all__ = ["ReadAhead"]

logger = logging.getLogger(__name__)

#: how long dropping a computed batch waits for its cancelled Spark job, and how often it
#: interrupts the run's Spark jobs meanwhile (seconds)
DROP_WAIT_S = 30.0
INTERRUPT_EVERY_S = 0.5


@dataclass(frozen=True)
class _Computing:
    """One batch being computed on the read-ahead thread."""

    after: Plan  # the plan of the batch it follows
    plan: Plan
    batch: Batch
    future: Future[Any]


class ReadAhead:
    """At most one batch computed ahead of the run loop (`compute`: a ComputesFirst writer's
    compute_batch), on one thread for the whole run (a thread of its own per batch cost ~4 ms of
    the driver's: a new py4j connection and the properties copied each time), which runs its Spark
    jobs as the run's thread does (:func:`_thread_context`, taken when the ReadAhead is made: in the
    run's job group). `interrupt` cancels that group's jobs (the run's: nothing else of the run is
    running when a computed batch is dropped). :meth:`close` when the run ends."""

    def __init__(self, spark: Any, compute: Callable[[Batch], Any], interrupt: Callable[[], None]) -> None:
        self._spark = spark
        self._compute = compute
        self._interrupt = interrupt
        self._inherit = _thread_context(spark)
        self._thread: ThreadPoolExecutor | None = None
        self._computing: _Computing | None = None

    def start(self, after: Plan, plan: Plan, batch: Batch) -> None:
        """Compute `batch` (planned from `after` as `plan`) now, on the read-ahead thread."""
        self.drop()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(
                1, thread_name_prefix=f"read-ahead-{batch.run.job[:30]}", initializer=self._inherit
            )
        self._computing = _Computing(after, plan, batch, self._thread.submit(self._compute, batch))

    def take(self, committed: Plan | None, number: int) -> tuple[Plan, Callable[[], Any]] | None:
        """The batch computed ahead when it is batch `number`, the one after the `committed` plan:
        its plan and the call that returns its result (waiting for it, raising its error). Any
        other computed batch is dropped, and None returned."""
        computing, self._computing = self._computing, None
        if computing is None:
            return None
        if committed is not None and computing.after is committed and computing.batch.number == number:
            return computing.plan, computing.future.result
        self._drop(computing)
        return None

    def drop(self) -> None:
        """Drop the batch computed ahead, if any: its Spark job cancelled, its result unused."""
        computing, self._computing = self._computing, None
        if computing is not None:
            self._drop(computing)

    def close(self) -> None:
        """Drop the batch computed ahead, if any, and end the read-ahead thread."""
        self.drop()
        self._end_thread()

    def _end_thread(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    def _drop(self, computing: _Computing) -> None:
        # interrupted again every INTERRUPT_EVERY_S: the compute may submit its Spark job (or its
        # next one) after an interrupt, which cancels only the jobs running at the time
        deadline = time.monotonic() + DROP_WAIT_S
        while not computing.future.done():
            self._interrupt()
            if wait([computing.future], INTERRUPT_EVERY_S).done:
                return
            if time.monotonic() < deadline:
                continue
            logger.warning(
                "job=%r batch=%d: its compute, ahead of a batch that did not commit, is still running "
                "%ss after it was cancelled; leaving it (its result is never written)",
                computing.batch.run.job,
                computing.batch.number,
                DROP_WAIT_S,
            )
            self._end_thread()  # the next batch computed ahead must not queue behind it
            return


def _thread_context(spark: Any) -> Callable[[], None]:
    """What a new thread calls first to run its Spark jobs as this thread's would: in the same job
    group and with the same local properties (classic Spark, pinned threads), or with the same
    operation tags (Spark Connect). Taken now, on the calling thread."""
    if session.is_connect(spark):
        tags = set(spark.getTags())

        def tag() -> None:
            for t in tags:
                spark.addTag(t)

        return tag
    jsc = spark.sparkContext._jsc.sc()
    properties = jsc.getLocalProperties().clone()
    return lambda: jsc.setLocalProperties(properties)
