"""A shared round's task killed around its joint transaction (txn_offsets.commit.commit_units): its
jobs' units commit all or nothing, so a worker killed before the COMMIT leaves nothing of any of them (the
retried task commits them all, none found already committed), and one killed after it leaves all
of them committed (the retried task finds every one of them already committed). Each job exact."""

from __future__ import annotations

import collections
import os
from typing import Any

import sqlalchemy as sa
from pyspark import TaskContext

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce
from tests.integration.spark.many.test_many_jobs import _tables
from tests.kafka_ends import settled_ends
from txn_offsets import StartPolicy
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.planner import Limits
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


def _run(
    spark: Any,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topics: list[str],
    tables: list[str],
    job_name: str,
    last: PartitionWriter[Any, Any],
) -> dict[str, Any]:
    jobs: dict[str, dict[str, Any]] = {}
    for i, letter in enumerate(JOBS):
        writer = last if letter == "d" else counting_writer(tables[i])
        jobs[f"{job_name}-{letter}"] = {
            "kafka": kafka,
            "database": db,
            "writer": writer,
            "topics": [topics[i]],
            "start": StartPolicy.earliest(),
            "limits": Limits(max_records_per_partition=100),
            "until_caught_up": True,
        }
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    return result.summaries  # type: ignore[no-any-return]


def _exact(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    job_name: str,
    topics: list[str],
    tables: list[str],
    expected: list[dict[str, int]],
) -> None:
    for i, letter in enumerate(JOBS):
        assert totals(engine, tables[i]) == dict(expected[i]), letter
        ends = settled_ends(kafka.bootstrap_servers, topics[i], PARTITIONS)
        assert stored_offsets(engine, db, f"{job_name}-{letter}") == ends, letter


def test_a_worker_killed_inside_the_joint_transaction_commits_nothing_of_its_units(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topics = [topic_factory(partitions=PARTITIONS) for _ in JOBS]
    expected = [produce(t, RECORDS, PARTITIONS, keys=13 + i) for i, t in enumerate(topics)]
    tables = _tables(engine, db, len(JOBS))
    summaries = _run(spark, db, kafka, topics, tables, job_name, _killed_before_commit(tables[3]))
    _exact(engine, db, kafka, job_name, topics, tables, expected)
    # the killed attempts committed nothing, not even the units written before the kill: every
    # range of every job was committed once, by a retried task, none found already committed
    for letter in JOBS:
        summary = summaries[f"{job_name}-{letter}"]
        assert summary.records == RECORDS and summary.already_committed == 0, (letter, summary)


def test_a_worker_killed_after_the_joint_commit_finds_its_units_committed(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topics = [topic_factory(partitions=PARTITIONS) for _ in JOBS]
    expected = [produce(t, RECORDS, PARTITIONS, keys=23 + i) for i, t in enumerate(topics)]
    tables = _tables(engine, db, len(JOBS))
    base = counting_writer(tables[3])
    dying = PartitionWriter(
        write=base.write, decode=base.decode, aggregate=base.aggregate, after_commit=_die_after_commit
    )
    summaries = _run(spark, db, kafka, topics, tables, job_name, dying)
    _exact(engine, db, kafka, job_name, topics, tables, expected)
    # "d"'s units were committed with their task's other unit, then the worker died: the retried
    # task found both committed (each alone, once the joint claims gave way)
    found = {letter: summaries[f"{job_name}-{letter}"].already_committed for letter in JOBS}
    assert found["d"] == PARTITIONS * (RECORDS // PARTITIONS // 100), found
    assert sum(found[letter] for letter in "abc") >= PARTITIONS, found  # a partner's unit, at least
