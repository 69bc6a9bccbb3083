"""One batch on Spark: its ranges as an RDD with exactly one Spark partition per range.

Partition ``i`` of every RDD made here belongs to ``ranges[i]``, so a task always knows its range,
even when the range holds no visible record (only transaction markers or aborted records): such a
range still commits and advances its offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.executor import ReadOptions, ReadTask
from txn_offsets.store.runs import Run

__all__ = ["Batch"]


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
