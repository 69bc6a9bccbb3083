"""One batch on Spark: its ranges as an RDD with exactly one Spark partition per range.

Partition ``i`` of every RDD made here belongs to ``ranges[i]``, so a task always knows its range,
even when the range holds no visible record (only transaction markers or aborted records): such a
range still commits and advances its offset.
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

__all__ = ["Batch", "batch_deadline"]

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

    def ranges_rdd(self) -> Any:
        """An RDD of len(ranges) partitions; partition i stands for ranges[i] (its data is unused)."""
        n = len(self.ranges)
        return self.spark.sparkContext.parallelize(range(n), n)

    def records(self) -> Any:
        """RDD[Record]: partition i holds the visible records of ranges[i], in offset order."""
        task = ReadTask(self.kafka, self.ranges, self.read)
        return self.ranges_rdd().mapPartitionsWithIndex(task, preservesPartitioning=True)


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
