"""A Spark Python worker's heap is frozen at its first txn_offsets task (txn_offsets.spark.worker_heap):
what is alive then (pyspark, pyarrow, txn_offsets, ...) is out of the cyclic collector's reach, which
otherwise traversed it again and again while records were read (0.39-0.44 s of CPU for 200,000 records
into Arrow batches, 0.25 s frozen). A driver's heap is never frozen."""

from __future__ import annotations

import gc
from typing import Any

from txn_offsets.config import KafkaSettings
from txn_offsets.spark.tasks import ReadTask
from txn_offsets.spark.worker_heap import freeze_worker_heap


def _frozen_around_a_read(_part: Any) -> list[tuple[int, int, bool]]:
    before = gc.get_freeze_count()
    records = list(ReadTask(KafkaSettings("127.0.0.1:9"), ())(0, [()]))  # no ranges: nothing read
    return [(before, gc.get_freeze_count(), freeze_worker_heap() or bool(records))]


def test_a_workers_heap_is_frozen_at_its_first_task_and_a_drivers_never(spark: Any) -> None:
    got = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(_frozen_around_a_read).collect()
    assert len(got) == 2
    for _before, after, again in got:
        assert after > 0  # frozen: the worker's modules and more (0 before, unless a task froze it)
        assert again is False  # once per worker
    # the driver (this process) calls it outside a task: nothing frozen
    count = gc.get_freeze_count()
    assert freeze_worker_heap() is False
    assert gc.get_freeze_count() == count
