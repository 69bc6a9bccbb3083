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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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


@dataclass
class _Computing:
    """One batch being computed in a thread of its own."""

    after: Plan  # the plan of the batch it follows
    plan: Plan
    batch: Batch
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        """The compute's result, once it finished; its error raised."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class ReadAhead:
    """At most one batch computed ahead of the run loop (`compute`: a ComputesFirst writer's
    compute_batch), in the Spark job group of the run's thread; `interrupt` cancels that group's
    jobs (the run's: nothing else of the run is running when a computed batch is dropped)."""

    def __init__(self, spark: Any, compute: Callable[[Batch], Any], interrupt: Callable[[], None]) -> None:
        self._spark = spark
        self._compute = compute
        self._interrupt = interrupt
        self._computing: _Computing | None = None

    def start(self, after: Plan, plan: Plan, batch: Batch) -> None:
        """Compute `batch` (planned from `after` as `plan`) now, in a thread."""
        self.drop()
        computing = _Computing(after, plan, batch)
        inherit = _thread_context(self._spark)

        def run() -> None:
            try:
                inherit()
                computing.result = self._compute(batch)
            except BaseException as exc:  # raised where the run loop takes the batch
                computing.error = exc
            finally:
                computing.done.set()

        thread = threading.Thread(
            target=run, name=f"read-ahead-{batch.run.job[:30]}-{batch.number}", daemon=True
        )
        self._computing = computing
        thread.start()

    def take(self, committed: Plan | None, number: int) -> tuple[Plan, Callable[[], Any]] | None:
        """The batch computed ahead when it is batch `number`, the one after the `committed` plan:
        its plan and the call that returns its result (waiting for it, raising its error). Any
        other computed batch is dropped, and None returned."""
        computing, self._computing = self._computing, None
        if computing is None:
            return None
        if committed is not None and computing.after is committed and computing.batch.number == number:
            return computing.plan, computing.outcome
        self._drop(computing)
        return None

    def drop(self) -> None:
        """Drop the batch computed ahead, if any: its Spark job cancelled, its result unused."""
        computing, self._computing = self._computing, None
        if computing is not None:
            self._drop(computing)

    def _drop(self, computing: _Computing) -> None:
        # interrupted again every INTERRUPT_EVERY_S: the compute may submit its Spark job (or its
        # next one) after an interrupt, which cancels only the jobs running at the time
        deadline = time.monotonic() + DROP_WAIT_S
        while not computing.done.is_set():
            self._interrupt()
            if computing.done.wait(INTERRUPT_EVERY_S):
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
