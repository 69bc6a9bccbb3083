"""A run's batches are Spark jobs of one job group, set once for the run (each setting is a round
trip to the JVM) and cleared when it ends; the batch timeout cancels that group (test_job_faults)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from txn_offsets.planner import Limits
from txn_offsets.spark.summary import BatchReport


def test_a_runs_batches_share_one_job_group_cleared_at_its_end(
    spark: Any,
    engine: sa.Engine,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 3_000, 2)
    sc = spark.sparkContext
    groups: list[str | None] = []

    def seen(_report: BatchReport) -> None:  # called in the run's thread after each batch
        groups.append(sc.getLocalProperty("spark.jobGroup.id"))

    summary = run_test_job(
        counting_writer(counts_table), [topic], limits=Limits(max_records_per_batch=1_000), on_batch=seen
    )
    assert summary.batches == 3 and summary.records == 3_000
    assert len(groups) == 3 and len(set(groups)) == 1, groups
    group = groups[0]
    assert group is not None and group.startswith("txn-offsets-")
    # one Spark job per batch, all in the run's group; the thread has no group after the run
    assert len(sc.statusTracker().getJobIdsForGroup(group)) == 3
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert totals(engine, counts_table) == dict(expected)
