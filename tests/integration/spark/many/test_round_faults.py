"""A shared round's task killed around its joint transaction (txn_offsets.commit.commit_units): its
jobs' units commit all or nothing, so a worker killed before the COMMIT leaves nothing of any of them (the
retried task commits them all, none found already committed), and one killed after it leaves all
of them committed (the retried task finds every one of them already committed). Each job exact."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from pyspark import TaskContext

from tests.integration.spark.counting import Counting, counting_writer
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.many import run_jobs
from txn_offsets.spark.writers import PartitionWriter

PARTITIONS = 2
RECORDS = 400  # per topic: 2 batches of 100 per partition
JOBS = "abcd"  # 2 units per round task on local[2]; "d" sorts last in its task's transaction


def _first_attempt() -> bool:
    ctx = TaskContext.get()
    return ctx is not None and ctx.attemptNumber() == 0


def _killed_before_commit(table: str) -> PartitionWriter[str, collections.Counter[str]]:
    """The counting writer, whose worker dies after writing, on a task's first attempt: inside the
    joint transaction, after the units of the jobs sorted before it were claimed and written."""
    base = counting_writer(table)
    write = base.write

    def dying_write(conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        assert write is not None
        write(conn, rng, counts)
        if _first_attempt():
            os._exit(17)

    return PartitionWriter(write=dying_write, decode=base.decode, aggregate=base.aggregate)


def _die_after_commit(rng: OffsetRange, outcome: str) -> None:
    if _first_attempt():
        os._exit(17)


def _run_exact(
    spark: Any, counting: Counting, keys: int, last: Callable[[str], PartitionWriter[Any, Any]]
) -> dict[str, Any]:
    """Jobs a-d, each counting its own topic (RECORDS records of keys + i keys) into its own table,
    in shared rounds; "d" with the writer `last(its table)`. Each job exact; their summaries."""
    topics, expected = counting.topics(len(JOBS), PARTITIONS, RECORDS, keys=keys)
    tables = counting.tables(len(JOBS))
    jobs: dict[str, dict[str, Any]] = {}
    for i, letter in enumerate(JOBS):
        writer = last(tables[i]) if letter == "d" else counting_writer(tables[i])
        limits = Limits(max_records_per_partition=100)
        jobs[f"{counting.job}-{letter}"] = counting.job_options(
            tables[i], topics[i], writer=writer, limits=limits
        )
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    for i, name in enumerate(jobs):
        counting.assert_exact(topics[i], PARTITIONS, expected[i], table=tables[i], job=name)
    return result.summaries  # type: ignore[no-any-return]


def test_a_worker_killed_inside_the_joint_transaction_commits_nothing_of_its_units(
    spark: Any, counting: Counting
) -> None:
    summaries = _run_exact(spark, counting, 13, _killed_before_commit)
    # the killed attempts committed nothing, not even the units written before the kill: every
    # range of every job was committed once, by a retried task, none found already committed
    for letter in JOBS:
        summary = summaries[f"{counting.job}-{letter}"]
        assert summary.records == RECORDS and summary.already_committed == 0, (letter, summary)


def test_a_worker_killed_after_the_joint_commit_finds_its_units_committed(
    spark: Any, counting: Counting
) -> None:

    def dying(table: str) -> PartitionWriter[Any, Any]:
        return dataclasses.replace(counting_writer(table), after_commit=_die_after_commit)

    summaries = _run_exact(spark, counting, 23, dying)
    # "d"'s units were committed with their task's other unit, then the worker died: the retried
    # task found both committed (each alone, once the joint claims gave way)
    found = {letter: summaries[f"{counting.job}-{letter}"].already_committed for letter in JOBS}
    assert found["d"] == PARTITIONS * (RECORDS // PARTITIONS // 100), found
    assert sum(found[letter] for letter in "abc") >= PARTITIONS, found  # a partner's unit, at least
