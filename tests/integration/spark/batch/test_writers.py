"""The per-batch writer (results that need a shuffle) and fencing of a zombie run's tasks."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import (
    counting_writer,
    counts_table_of,
    key_of,
    stored_offsets,
    totals,
)
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced, JobAlreadyRunning
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.writers import BatchWriter, PartitionWriter
from txn_offsets.store.database import engine_for
from txn_offsets.store.runs import start_run
from txn_offsets.upserts import upsert_add


def shuffle_counts(records: Any) -> list[tuple[str, int]]:
    result: list[tuple[str, int]] = (
        records.map(lambda r: (key_of(r), 1)).reduceByKey(operator.add, 3).collect()
    )
    return result


def batch_counts_writer(table: str) -> BatchWriter[list[tuple[str, int]]]:
    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]) -> None:
        upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])

    return BatchWriter(compute=shuffle_counts, write=write)


def test_per_batch_writer_with_a_shuffle(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=4)
    expected = produce(topic, 10_000, 4)
    summary = run_test_job(
        batch_counts_writer(counts_table), [topic], limits=Limits(max_records_per_batch=3_000)
    )
    assert totals(engine, counts_table) == dict(expected)
    assert summary.batches == 4  # 10,000 records in batches of at most 3,000
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)


def test_replaying_a_committed_batch_is_a_no_op(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 1_000, 2)
    eng = engine_for(db)
    run = start_run(eng, db, job_name)
    plan = plan_batch(
        eng,
        db,
        kafka,
        job=job_name,
        selection=TopicSelection((topic,)),
        start=StartPolicy.earliest(),
        limits=Limits(),
    )
    batch = Batch(1, plan.ranges, spark, db, kafka, run)
    first = batch_counts_writer(counts_table).commit(batch)
    again = batch_counts_writer(counts_table).commit(batch)  # e.g. the driver retried after a lost ack
    per_partition = counting_writer(counts_table).commit(batch)
    eng.dispose()
    assert [r.outcome for r in first] == ["committed", "committed"]
    assert [r.outcome for r in again] == ["already_committed", "already_committed"]
    assert [r.outcome for r in per_partition] == ["already_committed", "already_committed"]
    assert totals(engine, counts_table) == dict(expected)


def test_zombie_run_is_fenced_and_writes_nothing(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=2)
    produce(topic, 1_000, 2)
    eng = engine_for(db)
    zombie = start_run(eng, db, job_name)
    plan = plan_batch(
        eng,
        db,
        kafka,
        job=job_name,
        selection=TopicSelection((topic,)),
        start=StartPolicy.earliest(),
        limits=Limits(),
    )
    newer = start_run(eng, db, job_name, force=True)  # a new deployment fences the old one
    reports = counting_writer(counts_table).commit(Batch(1, plan.ranges, spark, db, kafka, zombie))
    assert {r.outcome for r in reports} == {"fenced"}
    assert all(isinstance(r.error, Fenced) for r in reports)
    err = reports[0].error
    assert isinstance(err, Fenced)
    assert (err.generation, err.current) == (zombie.generation, newer.generation)
    batch_reports = batch_counts_writer(counts_table).commit(Batch(1, plan.ranges, spark, db, kafka, zombie))
    assert {r.outcome for r in batch_reports} == {"fenced"}
    eng.dispose()
    assert totals(engine, counts_table) == {}
    assert set(stored_offsets(engine, db, job_name).values()) == {0}
    with pytest.raises(Fenced):
        for report in reports:
            if report.error is not None:
                raise report.error


def test_lease_is_renewed_during_a_long_batch(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    expected = produce(topic, 100, 1)
    started = tmp_path / "write-started"
    base = counting_writer(counts_table)

    def slow_write(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        started.touch()
        time.sleep(6)  # three times the lease below
        base.write(conn, rng, counts)

    writer = PartitionWriter(write=slow_write, decode=base.decode, aggregate=base.aggregate)
    result: dict[str, Any] = {}

    def job() -> None:
        result["summary"] = run_test_job(
            writer,
            [topic],
            lease_s=2,
            batch_interval_s=0.5,  # the lease must outlast the wait between batches
        )

    thread = threading.Thread(target=job)
    thread.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists()
    time.sleep(3)  # past the 2 s lease: only the renewal keeps it alive
    eng = engine_for(db)
    with pytest.raises(JobAlreadyRunning):
        start_run(eng, db, job_name)
    eng.dispose()
    thread.join(timeout=120)
    assert result["summary"].records == 100
    assert totals(engine, counts_table) == dict(expected)
