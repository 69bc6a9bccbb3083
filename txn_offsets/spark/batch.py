"""One batch on Spark: its ranges spread over a few Spark tasks, on one of two execution paths.

Each task is given the indexes of its ranges as its input, so it always knows its ranges, even one
that holds no visible record (only transaction markers or aborted records): such a range still
commits and advances its offset. A batch has at most one task per core by default: a Spark task
costs tens of milliseconds however small its range, which dominates small batches.

The tasks run on the RDD path (``parallelize`` + ``mapPartitionsWithIndex``: classic Spark only) or
on the DataFrame path (``spark.range`` + ``mapInArrow``, :mod:`txn_offsets.spark.frames`: classic
Spark and Spark Connect). ``execution="auto"`` takes the DataFrame path on a Connect session and the
RDD path otherwise; the task bodies, and so the outcomes, are the same on both.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark import frames, session
from txn_offsets.spark.frames import EXECUTION_PATHS, Execution, check_execution
from txn_offsets.spark.tasks import PartitionTask, ReadOptions, ReadTask, TaskReport
from txn_offsets.store.runs import Run

__all__ = [
    "EXECUTION_PATHS",
    "Batch",
    "Deadlines",
    "assign_ranges",
    "batch_deadline",
    "check_execution",
    "spark_error_summary",
    "spark_group",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """The ranges of one batch and what tasks need to read and commit them."""

    number: int
    ranges: tuple[OffsetRange, ...]
    spark: Any  # pyspark.sql.SparkSession
    database: DatabaseSettings
    kafka: KafkaSettings
    run: Run
    read: ReadOptions = field(default_factory=ReadOptions)
    execution: Execution = "auto"
    # run_jobs' shared rounds (Rounds.submit of txn_offsets.spark.rounds): a PartitionWriter's task
    # runs in the next round, one Spark job with the other jobs' batches; None: a Spark job of its own
    shared_round: Callable[[PartitionTask[Any]], list[TaskReport]] | None = None

    def __post_init__(self) -> None:
        check_execution(self.execution, self.spark)

    @property
    def path(self) -> str:
        """The execution path this batch takes: 'rdd' or 'dataframe'."""
        if self.execution != "auto":
            return self.execution
        return "dataframe" if session.is_connect(self.spark) else "rdd"

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Range indexes per Spark task: at most ``read.max_tasks`` (default: the session's cores)
        groups balanced by span, largest range first (LPT), each group in range order."""
        limit = self.read.max_tasks or session.session_cores(self.spark)
        return assign_ranges([r.span for r in self.ranges], max(1, min(len(self.ranges), limit)))

    def ranges_rdd(self) -> Any:
        """An RDD with one partition per group; its only element is the group's range indexes
        (the RDD path; classic Spark only)."""
        groups = self.groups()
        return self.spark.sparkContext.parallelize(groups, len(groups))

    def records(self) -> Any:
        """RDD[Record]: the visible records of every range, each range in offset order (classic
        Spark only)."""
        task = ReadTask(self.kafka, self.ranges, self.read)
        return self.ranges_rdd().mapPartitionsWithIndex(task, preservesPartitioning=True)

    def records_frame(self) -> Any:
        """A DataFrame of the visible records of every range (``frames.record_schema()``: key, value,
        topic, partition, offset, timestamp, headers), one Spark partition per task group, each
        range in offset order. Uses no RDD API: the same on classic Spark and Spark Connect."""
        task = ReadTask(self.kafka, self.ranges, self.read)
        return frames.records_frame(self.spark, self.groups(), task, self.read.batch_size)


def assign_ranges(spans: list[int], tasks: int) -> tuple[tuple[int, ...], ...]:
    """Spread range indexes over `tasks` groups: the largest span goes to the lightest group.
    Placement only affects parallelism, never correctness (every range is claimed by its own guard).
    Ties go to the lower index (ranges) and group (tasks); the lightest group is kept in a heap: a
    linear search of the groups with a key function per range cost 14 ms a 4,096-range batch on a
    busy driver, before the batch's Spark job could start."""
    lightest = [(0, g) for g in range(tasks)]  # (load, group): a heap already
    groups: list[list[int]] = [[] for _ in range(tasks)]
    # largest span first, equal spans in index order (a reversed sort keeps equal keys in order)
    for i in sorted(range(len(spans)), key=spans.__getitem__, reverse=True):
        load, g = lightest[0]
        groups[g].append(i)
        heapq.heapreplace(lightest, (load + spans[i], g))
    return tuple(tuple(sorted(g)) for g in groups if g)


def spark_error_summary(exc: BaseException) -> str:
    """The Python error inside a Spark job's failure, without the JVM stack trace (a batch's or an
    epoch's BatchFailed says it)."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        stripped = line.strip()
        if stripped.startswith(("txn_offsets.", "psycopg.", "sqlalchemy.")) or "Error:" in stripped:
            return stripped[:1000]
    return text.splitlines()[0][:1000] if text else type(exc).__name__


@contextlib.contextmanager
def batch_deadline(spark: Any, group: str, timeout_s: float | None) -> Iterator[threading.Event]:
    """Run the body's Spark jobs in job group `group` (under Spark Connect: with operation tag
    `group`); after `timeout_s` cancel them (:func:`spark_group` + :class:`Deadlines`).

    Cancelling interrupts the tasks and Spark kills their Python workers, even one frozen by
    SIGSTOP, whose database session then ends, releasing any claimed row. The yielded event is set
    if the deadline fired (the body's collect() then fails).
    """
    with spark_group(spark, group) as interrupt:
        deadlines = Deadlines(interrupt)  # one batch: its thread ends with it
        try:
            with deadlines.during(group, timeout_s) as expired:
                yield expired
        finally:
            deadlines.close()


@contextlib.contextmanager
def spark_group(spark: Any, group: str) -> Iterator[Callable[[], None]]:
    """Run the body's Spark jobs (this thread's) in job group `group` (under Spark Connect: with
    operation tag `group`); yields the call that cancels them. A run sets it once for all its
    batches (one at a time): each setting is a round trip to the JVM or the Connect server."""
    if session.is_connect(spark):
        # no SparkContext: tag this thread's operations, interrupt them by tag (a server-side call
        # that any thread may make)
        spark.addTag(group)
        interrupt = functools.partial(spark.interruptTag, group)
        clear = functools.partial(spark.removeTag, group)
    else:
        sc = spark.sparkContext
        sc.setJobGroup(group, "txn_offsets", interruptOnCancel=True)
        interrupt = functools.partial(sc.cancelJobGroup, group)
        clear = functools.partial(sc.setLocalProperty, "spark.jobGroup.id", None)
    try:
        yield interrupt
    finally:
        clear()


class Deadlines:
    """Interrupt the Spark jobs of a batch still running after its timeout: for the batches of one
    run, one at a time, on one thread for the whole run (a timer thread per batch cost ~2 ms).
    The run's batches share one job group (:func:`spark_group`), so an interrupt fired just as a
    batch ends may reach the next batch's Spark job: that batch then fails like any cancelled one
    and is planned again from the table."""

    def __init__(self, interrupt: Callable[[], None]) -> None:
        self._interrupt = interrupt
        self._cond = threading.Condition()
        self._due: float | None = None  # monotonic time the armed batch expires
        self._expired = threading.Event()
        self._label = ""
        self._timeout_s: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def during(self, label: str, timeout_s: float | None) -> Iterator[threading.Event]:
        """Interrupt the run's Spark jobs if the body still runs after `timeout_s` (None: never);
        the yielded event is set if it did."""
        expired = threading.Event()
        if timeout_s is None:
            yield expired
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("Deadlines is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"deadline-{label[:30]}", daemon=True)
                self._thread.start()
            self._due, self._expired, self._label, self._timeout_s = (
                time.monotonic() + timeout_s,
                expired,
                label,
                timeout_s,
            )
            self._cond.notify_all()
        try:
            yield expired
        finally:
            with self._cond:
                self._due = None
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._due is None or time.monotonic() < self._due):
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                if self._closed:
                    return
                self._due = None
                expired, label, timeout_s = self._expired, self._label, self._timeout_s
                expired.set()
            logger.warning("batch %s: still running after %ss; cancelling its Spark jobs", label, timeout_s)
            self._interrupt()
