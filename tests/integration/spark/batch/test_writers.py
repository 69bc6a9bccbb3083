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

from tests.integration.spark.counting import Counting, counts_table_of, key_of
from txn_offsets.errors import Fenced, JobAlreadyRunning
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.writers import BatchWriter
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
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


def test_per_batch_writer_with_a_shuffle(counting: Counting) -> None:
    topic, expected = counting.topic(4, 10_000)
    writer = batch_counts_writer(counting.table)
    summary = counting.run(topic, writer=writer, limits=Limits(max_records_per_batch=3_000))
    assert counting.totals() == dict(expected)
    assert summary.batches == 4  # 10,000 records in batches of at most 3,000
    assert counting.offsets() == counting.ends(topic, 4)
    # what it committed: the offsets of its ranges (a plain topic: one record each), not 0
    assert summary.records == sum(expected.values()) == 10_000
    assert sum(r.records for r in summary.outcomes) == 10_000


def test_replaying_a_committed_batch_is_a_no_op(spark: Any, counting: Counting) -> None:
    topic, expected = counting.topic(2, 1_000)
    db, kafka = counting.db, counting.kafka
    eng = engine_for(db)
    run = start_run(Store(eng, db), counting.job)
    batch = Batch(1, counting.first_plan(eng, topic).ranges, spark, db, kafka, run)
    first = batch_counts_writer(counting.table).commit(batch)
    again = batch_counts_writer(counting.table).commit(batch)  # e.g. the driver retried after a lost ack
    per_partition = counting.writer().commit(batch)
    eng.dispose()
    assert [r.outcome for r in first] == ["committed", "committed"]
    assert [r.outcome for r in again] == ["already_committed", "already_committed"]
    assert [r.outcome for r in per_partition] == ["already_committed", "already_committed"]
    assert counting.totals() == dict(expected)


def test_zombie_run_is_fenced_and_writes_nothing(spark: Any, counting: Counting) -> None:
    topic, _ = counting.topic(2, 1_000)
    db, kafka = counting.db, counting.kafka
    eng = engine_for(db)
    zombie = start_run(Store(eng, db), counting.job)
    plan = counting.first_plan(eng, topic)
    newer = start_run(Store(eng, db), counting.job, force=True)  # a new deployment fences the old one
    reports = counting.writer().commit(Batch(1, plan.ranges, spark, db, kafka, zombie))
    assert {r.outcome for r in reports} == {"fenced"}
    assert all(isinstance(r.error, Fenced) for r in reports)
    err = reports[0].error
    assert isinstance(err, Fenced)
    assert (err.generation, err.current) == (zombie.generation, newer.generation)
    batch_reports = batch_counts_writer(counting.table).commit(
        Batch(1, plan.ranges, spark, db, kafka, zombie)
    )
    assert {r.outcome for r in batch_reports} == {"fenced"}
    eng.dispose()
    assert counting.totals() == {}
    assert set(counting.offsets().values()) == {0}
    with pytest.raises(Fenced):
        for report in reports:
            if report.error is not None:
                raise report.error


def test_lease_is_renewed_during_a_long_batch(counting: Counting, tmp_path: Path) -> None:
    topic, expected = counting.topic(1, 100)
    started = tmp_path / "write-started"
    base = counting.writer()

    def slow_write(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        started.touch()
        time.sleep(6)  # three times the lease below
        base.write(conn, rng, counts)

    writer = counting.writer(write=slow_write)
    result: dict[str, Any] = {}

    def job() -> None:
        result["summary"] = counting.run(
            topic,
            writer=writer,
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
    eng = engine_for(counting.db)
    with pytest.raises(JobAlreadyRunning):
        start_run(Store(eng, counting.db), counting.job)
    eng.dispose()
    thread.join(timeout=120)
    assert result["summary"].records == 100
    assert counting.totals() == dict(expected)
