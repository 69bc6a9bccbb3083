"""A Spark Python worker's heap is frozen at its first txn_offsets task (txn_offsets.spark.heap):
what is alive then (pyspark, pyarrow, txn_offsets, ...) is out of the cyclic collector's reach, which
otherwise traversed it again and again while records were read (0.39-0.44 s of CPU for 200,000 records
into Arrow batches, 0.25 s frozen). A driver's heap is not frozen by a task body, only while a run
runs (unfrozen when it ends)."""

from __future__ import annotations

import gc
from typing import Any

from tests.integration.spark.counting import Counting
from txn_offsets.config import KafkaSettings
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.heap import freeze_worker_heap
from txn_offsets.spark.tasks import ReadTask


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


def test_a_drivers_heap_is_frozen_while_its_run_runs(counting: Counting) -> None:
    topic, expected = counting.topic(2, 2_000)
    assert gc.get_freeze_count() == 0
    during: list[int] = []
    summary = counting.run(
        topic,
        limits=Limits(max_records_per_batch=500),
        on_batch=lambda _report: during.append(gc.get_freeze_count()),
    )
    assert summary.records == 2_000 and counting.totals() == dict(expected)
    assert len(during) == summary.batches == 4
    assert all(n > 0 for n in during)  # frozen in every batch of the run
    assert gc.get_freeze_count() == 0  # and the application's heap given back at its end
