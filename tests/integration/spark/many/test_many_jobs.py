"""Many jobs in one Spark application (txn_offsets.spark.many.run_jobs): 4 jobs on threads of the
shared session, each exact against its own topic, running at the same time; SIGTERM stops them all
between batches; bad arguments change nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import Counting
from txn_offsets.errors import BatchFailed, ConfigError, TopicMissing
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.many import JobsFailed, run_jobs
from txn_offsets.spark.summary import BatchReport
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store.budget import DRIVER_CONNECTIONS
from txn_offsets.store.handle import Store
from txn_offsets.store.health import connection_headroom
from txn_offsets.store.runs import end_run, start_run

JOBS = 4
PARTITIONS = 2
RECORDS = 800  # per topic: 4 batches of 100 per partition


def test_four_jobs_on_threads_each_exact_and_concurrent(spark: Any, counting: Counting) -> None:
    topics, expected = counting.topics(JOBS, PARTITIONS, RECORDS, keys=31)
    tables = counting.tables(JOBS)
    commits: dict[str, list[float]] = {f"{counting.job}-{i}": [] for i in range(JOBS)}

    def on_batch(report: BatchReport) -> None:
        commits[report.job].append(time.monotonic())

    jobs = {
        f"{counting.job}-{i}": counting.job_options(
            tables[i], topics[i], limits=Limits(max_records_per_partition=100), on_batch=on_batch
        )
        for i in range(JOBS)
    }
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    assert sorted(result.summaries) == sorted(jobs)
    for i, name in enumerate(jobs):
        summary = result.summaries[name]
        assert summary.records == RECORDS and summary.stopped_by == "caught_up", summary
        assert summary.batches == RECORDS // PARTITIONS // 100
        assert summary.already_committed == 0
        counting.assert_exact(topics[i], PARTITIONS, expected[i], table=tables[i], job=name)
    # their batches shared Spark jobs: one per round, carrying every batch, fewer than the batches
    batches = sum(s.batches for s in result.summaries.values())
    assert result.round_batches == batches and 1 <= result.rounds < batches, result
    # and a round task committed its jobs' units in one transaction (txn_offsets.commit.commit_units): lineage
    # rows are only inserted, so their xmins are the transactions; fewer than the jobs' batches
    with counting.engine.connect() as conn:
        units, transactions = conn.execute(
            sa.text(
                "SELECT count(DISTINCT (job, batch)), count(DISTINCT xmin::text) "
                f'FROM "{counting.db.schema}".commits WHERE job = ANY(:jobs)'
            ),
            {"jobs": list(jobs)},
        ).one()
    assert units == batches and transactions < units, (units, transactions)
    # and their plans were made together (one Kafka request and transaction each): every plan, from
    # the first (which seeds) to the one that found them caught up
    assert result.plans == batches + JOBS and 1 <= result.shared_plans < result.plans, result
    # and their runs started in joint transactions (as many as JOBS if none overlapped)...
    assert 1 <= result.shared_starts <= JOBS, result
    # ...and all of them released their leases at the end (ended together or alone)
    jobs_table = f'"{counting.db.schema}".jobs'
    with counting.engine.connect() as conn:
        held = conn.execute(
            sa.text(f"SELECT count(*) FROM {jobs_table} WHERE job = ANY(:jobs) AND run_id IS NOT NULL"),
            {"jobs": list(jobs)},
        ).scalar_one()
    assert held == 0
    # they ran at the same time: every job committed a batch before any job committed its last
    deadline = time.monotonic() + 10
    while any(len(c) < summary.batches for c in commits.values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # on_batch runs on each run's publisher thread
    assert max(c[0] for c in commits.values()) < min(c[-1] for c in commits.values()), commits


def _count(records: Iterator[object]) -> int:
    return sum(1 for _ in records)


def _refusing_write(conn: sa.Connection, rng: OffsetRange, counts: object) -> None:
    raise RuntimeError(f"refused {rng.topic}[{rng.partition}]")


def _exiting_write(conn: sa.Connection, rng: OffsetRange, counts: object) -> None:
    os._exit(17)  # the Python worker ends mid-transaction: the Spark task (the round's) fails whole


# Before (exits): a round whose Spark task failed as a whole failed every job in it, and the next
# round carried the failing job again: all jobs used up their retries together and failed.
@pytest.mark.parametrize("failure", ["raises", "exits"])
def test_a_failing_job_fails_alone_in_shared_rounds(spark: Any, counting: Counting, failure: str) -> None:
    """A write that raises in a shared round's task fails its own job's batch only: the other jobs,
    whose units share the round's Spark tasks (and their joint transactions, which then give way to
    a transaction per unit), commit every batch, exact. A write that ends its Python worker fails
    the whole round: each job then runs its next batch in a Spark job of its own, and only the
    failing job fails."""
    good_topics, expected = counting.topics(3, PARTITIONS, 400, keys=17)
    bad_topic, _ = counting.topic(PARTITIONS, 400)
    tables = counting.tables(3)
    common = {"limits": Limits(max_records_per_partition=100), "retries": 1, "retry_backoff_s": 0.0}
    goods, bad = [f"{counting.job}-good{i}" for i in range(3)], f"{counting.job}-bad"
    refusing = PartitionWriter(
        write=_refusing_write if failure == "raises" else _exiting_write, aggregate=_count
    )
    jobs = {good: counting.job_options(tables[i], good_topics[i], **common) for i, good in enumerate(goods)}
    bad_job = counting.job_options(counting.table, bad_topic, writer=refusing, **common)
    result = run_jobs(spark, {**jobs, bad: bad_job})
    assert sorted(result.summaries) == goods and sorted(result.errors) == [bad]
    error = result.errors[bad]
    assert isinstance(error, BatchFailed) and error.job == bad
    if failure == "raises":
        assert "RuntimeError: refused" in str(error), error
    for i, good in enumerate(goods):
        # exact either way; a batch of the round that failed whole may have committed before the
        # worker ended, and the summary counts the records of the batches that succeeded
        assert counting.totals(tables[i]) == dict(expected[i])
        assert (
            result.summaries[good].records == 400
            if failure == "raises"
            else result.summaries[good].records > 0
        )
        assert counting.offsets(good) == counting.ends(good_topics[i], PARTITIONS)
    assert counting.offsets(bad) == {(bad_topic, p): 0 for p in range(PARTITIONS)}
    assert result.rounds >= 2  # both jobs' batches went to shared rounds


def test_sigterm_stops_every_job_between_batches(spark: Any, counting: Counting) -> None:
    topics, expected = counting.topics(JOBS, PARTITIONS, 400)
    tables = counting.tables(JOBS)
    first: dict[str, threading.Event] = {f"{counting.job}-{i}": threading.Event() for i in range(JOBS)}

    def on_batch(report: BatchReport) -> None:
        first[report.job].set()

    def kill_when_all_ran() -> None:
        for event in first.values():
            event.wait(60)
        # only with run_jobs' handler installed: the default SIGTERM would end pytest
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signal.SIGTERM)

    jobs = {
        name: counting.job_options(
            tables[i],
            topics[i],
            until_caught_up=False,
            batch_interval_s=0.2,  # following: only a signal stops them
            on_batch=on_batch,
        )
        for i, name in enumerate(first)
    }
    killer = threading.Thread(target=kill_when_all_ran, daemon=True)
    killer.start()
    result = run_jobs(spark, jobs)
    killer.join(5)
    result.raise_for_errors()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
    for i, name in enumerate(jobs):
        assert result.summaries[name].stopped_by == "signal"
        assert counting.totals(tables[i]) == dict(expected[i])  # whole batches only, all of them


def test_bad_arguments_start_nothing(spark: Any, counting: Counting) -> None:
    with pytest.raises(ConfigError, match="no job given"):
        run_jobs(spark, {})
    with pytest.raises(ConfigError, match=r"jobs\['a'\].*stop is set by run_jobs"):
        run_jobs(spark, {"a": {"kafka": counting.kafka, "database": counting.db, "stop": threading.Event()}})
    # jobs that each fit the server's connections but together do not: refused before any starts
    with counting.engine.connect() as conn:
        free = connection_headroom(conn).free
    many = {
        f"{counting.job}-{i}": {
            "kafka": counting.kafka,
            "database": counting.db,
            "writer": None,
            "topics": [],
        }
        for i in range(free // DRIVER_CONNECTIONS + 1)
    }
    with pytest.raises(ConfigError, match=rf"jobs: these {len(many)} jobs open up to"):
        run_jobs(spark, many)
    # a job that fails does not stop the other; the error names the job
    result = run_jobs(
        spark, {"bad": {"kafka": counting.kafka, "database": counting.db, "writer": None, "topics": []}}
    )
    assert not result.summaries and isinstance(result.errors["bad"], ConfigError)
    with pytest.raises(JobsFailed, match="'bad': ConfigError"):
        result.raise_for_errors()


def test_a_missing_topic_fails_its_job_alone_before_it_starts(spark: Any, counting: Counting) -> None:
    """run_jobs checks the jobs' topics together; one job naming a topic that does not exist fails
    alone with TopicMissing, before its run started (no generation bumped), and the other job runs."""
    topic, _ = counting.topic(PARTITIONS)
    expected = counting.produce(topic, 200, PARTITIONS, keys=13)
    (table,) = counting.tables(1)
    good, bad = f"{counting.job}-good", f"{counting.job}-bad"
    missing = counting.job_options(table, topic, topics=[topic, f"{topic}-missing"])
    result = run_jobs(spark, {good: counting.job_options(table, topic), bad: missing})
    assert sorted(result.summaries) == [good] and sorted(result.errors) == [bad]
    assert isinstance(result.errors[bad], TopicMissing) and f"{topic}-missing" in str(result.errors[bad])
    assert counting.totals(table) == dict(expected)
    with counting.engine.connect() as conn:
        assert (
            conn.execute(
                sa.text(f'SELECT count(*) FROM "{counting.db.schema}".jobs WHERE job = :job'), {"job": bad}
            ).scalar_one()
            == 0
        )  # never started


def test_the_first_round_waits_for_a_job_whose_start_is_slow(spark: Any, counting: Counting) -> None:
    """One job's run starts late (its job row is locked for a while: start_run waits on it): the
    first round waits for its first batch instead of leaving it to a round of its own, so every
    job's first batch commits in the same round (before: the late job's a round later)."""
    topics, _ = counting.topics(3, PARTITIONS, 4_000, keys=5)
    tables = counting.tables(3)
    names = [f"{counting.job}-{i}" for i in range(3)]
    late = names[2]
    store = Store(counting.engine, counting.db)
    end_run(store, start_run(store, late))  # its row exists, its lease released
    first: dict[str, float] = {}

    def on_batch(report: BatchReport) -> None:
        first.setdefault(report.job, time.monotonic())

    jobs = {
        name: counting.job_options(
            tables[i], topics[i], limits=Limits(max_records_per_partition=1_000), on_batch=on_batch
        )
        for i, name in enumerate(names)
    }
    jobs_table = f'"{counting.db.schema}".jobs'
    held = threading.Event()

    def hold_the_late_job() -> None:
        with counting.engine.begin() as conn:
            conn.execute(sa.text(f"SELECT 1 FROM {jobs_table} WHERE job = :job FOR UPDATE"), {"job": late})
            held.set()
            time.sleep(1.0)

    holder = threading.Thread(target=hold_the_late_job)
    holder.start()
    assert held.wait(30)
    try:
        result = run_jobs(spark, jobs)
    finally:
        holder.join(30)
    result.raise_for_errors()
    assert all(result.summaries[n].records == 4_000 for n in names)
    deadline = time.monotonic() + 10
    while len(first) < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)  # on_batch runs on each run's publisher thread
    spread = max(first.values()) - min(first.values())
    assert spread < 0.1, (spread, first)  # one round: its reports reach the jobs together
