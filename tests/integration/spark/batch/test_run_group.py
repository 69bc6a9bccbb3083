"""A run's batches are Spark jobs of one job group, set once for the run (each setting is a round
trip to the JVM) and cleared when it ends; the batch timeout cancels that group (test_job_faults)."""

from __future__ import annotations

from typing import Any

from tests.integration.spark.counting import Counting
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.summary import BatchReport


def test_a_runs_batches_share_one_job_group_cleared_at_its_end(spark: Any, counting: Counting) -> None:
    topic, expected = counting.topic(2, 3_000)
    sc = spark.sparkContext
    groups: list[str | None] = []

    def seen(_report: BatchReport) -> None:  # called in the run's thread after each batch
        groups.append(sc.getLocalProperty("spark.jobGroup.id"))

    summary = counting.run(topic, limits=Limits(max_records_per_batch=1_000), on_batch=seen)
    assert summary.batches == 3 and summary.records == 3_000
    assert len(groups) == 3 and len(set(groups)) == 1, groups
    group = groups[0]
    assert group is not None and group.startswith("txn-offsets-")
    # one Spark job per batch, all in the run's group; the thread has no group after the run
    assert len(sc.statusTracker().getJobIdsForGroup(group)) == 3
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert counting.totals() == dict(expected)
