"""One batch on Spark: its ranges spread over a few Spark tasks.

Each task is given the indexes of its ranges as its input, so it always knows its ranges, even one
that holds no visible record (only transaction markers or aborted records): such a range still
commits and advances its offset. A batch has at most one task per core by default: a Spark task
costs tens of milliseconds however small its range, which dominates small batches.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.executor import ReadOptions, ReadTask
from txn_offsets.store.runs import Run

__all__ = ["Batch", "assign_ranges", "batch_deadline"]

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

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Range indexes per Spark task: at most ``read.max_tasks`` (default: the session's cores)
        groups balanced by span, largest range first (LPT), each group in range order."""
        limit = self.read.max_tasks or _cores(self.spark)
        return assign_ranges([r.span for r in self.ranges], max(1, min(len(self.ranges), limit)))

    def ranges_rdd(self) -> Any:
        """An RDD with one partition per group; its only element is the group's range indexes."""
        groups = self.groups()
        return self.spark.sparkContext.parallelize(groups, len(groups))

    def records(self) -> Any:
        """RDD[Record]: the visible records of every range, each range in offset order."""
        task = ReadTask(self.kafka, self.ranges, self.read)
        return self.ranges_rdd().mapPartitionsWithIndex(task, preservesPartitioning=True)


def _cores(spark: Any) -> int:
    return int(spark.sparkContext.defaultParallelism)


def assign_ranges(spans: list[int], tasks: int) -> tuple[tuple[int, ...], ...]:
    """Spread range indexes over `tasks` groups: the largest span goes to the lightest group.
    Placement only affects parallelism, never correctness (one transaction per range)."""
    load = [0] * tasks
    groups: list[list[int]] = [[] for _ in range(tasks)]
    for i in sorted(range(len(spans)), key=lambda i: (-spans[i], i)):
        g = min(range(tasks), key=lambda g: (load[g], g))
        groups[g].append(i)
        load[g] += spans[i]
    return tuple(tuple(sorted(g)) for g in groups if g)


@contextlib.contextmanager
def batch_deadline(spark: Any, group: str, timeout_s: float | None) -> Iterator[threading.Event]:
    """Run the body's Spark jobs in job group `group`; after `timeout_s` cancel them.

    Cancelling interrupts the tasks and Spark kills their Python workers, even one frozen by
    SIGSTOP, whose database session then ends, releasing any claimed row. The yielded event is set
    if the deadline fired (the body's collect() then fails).
    """
    expired = threading.Event()
    sc = spark.sparkContext
    sc.setJobGroup(group, "txn_offsets batch", interruptOnCancel=True)

    def cancel() -> None:
        expired.set()
        logger.warning("batch %s: still running after %ss; cancelling its Spark jobs", group, timeout_s)
        sc.cancelJobGroup(group)

    timer = threading.Timer(timeout_s, cancel) if timeout_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield expired
    finally:
        if timer is not None:
            timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
