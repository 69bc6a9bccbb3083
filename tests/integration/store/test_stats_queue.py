"""Batch statistics of many jobs written together: record_many (one transaction, one row per job,
their sums) and the process's statistics queue that the runs' publishers use."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.store import stats, stats_queue
from txn_offsets.store.handle import Store


def _rows(engine: sa.Engine, db: DatabaseSettings, jobs: list[str]) -> dict[str, tuple[int, int, int, str]]:
    """(batches, committed, conflict, xmin) of each job's row."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f'SELECT job, batches, committed, conflict, xmin::text FROM "{db.schema}".job_stats '
                "WHERE job = ANY(:jobs)"
            ),
            {"jobs": jobs},
        ).all()
    return {r[0]: (int(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows}


def test_records_of_many_jobs_are_one_transaction_with_each_jobs_sums(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store
) -> None:
    jobs = [f"stats-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    records = [
        stats.batch_record(jobs[0], 0.2, {"committed": 2}),
        stats.batch_record(jobs[1], 1.5, {"committed": 1}),
        stats.batch_record(jobs[0], 0.3, {"committed": 3, "already_committed": 1}),
        stats.failure_record(jobs[2], "conflict"),
    ]
    assert stats.record_many(store, records)
    assert stats.record_many(store, [stats.batch_record(jobs[2], 0.1, {"committed": 4})])
    rows = _rows(engine, migrated, jobs)
    assert {job: row[:3] for job, row in rows.items()} == {
        jobs[0]: (2, 5, 0),
        jobs[1]: (1, 1, 0),
        jobs[2]: (1, 4, 1),
    }
    assert rows[jobs[0]][3] == rows[jobs[1]][3] != rows[jobs[2]][3]  # one transaction, then another
    with engine.connect() as conn:
        loaded = stats.load_stats(conn, migrated)[jobs[0]]
    assert sum(loaded.buckets) == 2 and loaded.batch_seconds_sum == pytest.approx(0.5)
    assert stats.record_many(store, [])  # nothing to count: no transaction


def test_the_queue_writes_every_record_and_says_so(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store
) -> None:
    jobs = [f"queued-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    futures = [
        stats_queue.submit(store, stats.batch_record(job, 0.05 * i, {"committed": i}))
        for i in range(1, 6)
        for job in jobs
    ]
    assert stats_queue.wait(futures)
    assert all(f.result() is True for f in futures)
    assert {job: row[:3] for job, row in _rows(engine, migrated, jobs).items()} == dict.fromkeys(
        jobs, (5, 15, 0)
    )


def test_bad_records_are_refused_when_made_and_a_failed_write_is_false(
    migrated: DatabaseSettings,
) -> None:
    with pytest.raises(ConfigError, match="seconds"):
        stats.batch_record("a-job", float("nan"), {})
    with pytest.raises(ConfigError, match="outcome"):
        stats.failure_record("a-job", "exploded")
    # a database that refuses the connection: False on the future, the queue's thread lives on
    unreachable = sa.create_engine("postgresql+psycopg://nobody:wrong@127.0.0.1:1/none")
    bad = stats_queue.submit(Store(unreachable, migrated), stats.batch_record("a-job", 1.0, {"committed": 1}))
    assert stats_queue.wait([bad]) is False and bad.result() is False
    unreachable.dispose()


def test_records_queued_after_a_write_wait_for_the_next_one_together(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store
) -> None:
    """At most one write per WRITE_EVERY_S: the records of batches that end one after another are
    summed into one transaction instead of one each, right after every batch (while the next one
    is being planned); a run that ends and waits for its records has them written at once."""
    first = f"first-{uuid.uuid4().hex[:8]}"
    assert stats_queue.wait([stats_queue.submit(store, stats.batch_record(first, 0.1, {}))])
    jobs = [f"paced-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    futures = []
    for job in jobs:  # batches ending 20 ms apart, no one waiting for their statistics
        futures.append(stats_queue.submit(store, stats.batch_record(job, 0.1, {"committed": 1})))
        time.sleep(0.02)
    assert stats_queue.wait(futures)
    rows = _rows(engine, migrated, jobs)
    assert {job: row[:3] for job, row in rows.items()} == dict.fromkeys(jobs, (1, 1, 0))
    assert len({row[3] for row in rows.values()}) == 1  # one transaction for the four
    assert stats_queue.WRITE_EVERY_S > 4 * 0.02
