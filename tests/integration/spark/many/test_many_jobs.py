"""Many jobs in one Spark application (txn_offsets.spark.many.run_jobs): 4 jobs on threads of the
shared session, each exact against its own topic, running at the same time; SIGTERM stops them all
between batches; bad arguments change nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce
from tests.kafka_ends import settled_ends
from txn_offsets import StartPolicy
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed, ConfigError, TopicMissing
from txn_offsets.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.many import JobsFailed, run_jobs
from txn_offsets.spark.runner import BatchReport
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store.budget import DRIVER_CONNECTIONS
from txn_offsets.store.health import connection_headroom
from txn_offsets.store.runs import end_run, start_run

JOBS = 4
PARTITIONS = 2
RECORDS = 800  # per topic: 4 batches of 100 per partition


def _tables(engine: sa.Engine, db: DatabaseSettings, n: int) -> list[str]:
    names = [f'"{db.schema}".counts_{i}' for i in range(n)]
    with engine.begin() as conn:
        for name in names:
            conn.execute(sa.text(f"CREATE TABLE {name} (k text PRIMARY KEY, n bigint NOT NULL)"))
    return names


def _counting_job(
    kafka: KafkaSettings,
    db: DatabaseSettings,
    table: str,
    topic: str,
    per_partition: int,
    on_batch: Callable[[BatchReport], None],
) -> dict[str, Any]:
    """run_job's keywords for a counting job over `topic` into `table`, until caught up."""
    return {
        "kafka": kafka,
        "database": db,
        "writer": counting_writer(table),
        "topics": [topic],
        "start": StartPolicy.earliest(),
        "limits": Limits(max_records_per_partition=per_partition),
        "until_caught_up": True,
        "on_batch": on_batch,
    }


def test_four_jobs_on_threads_each_exact_and_concurrent(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topics = [topic_factory(partitions=PARTITIONS) for _ in range(JOBS)]
    expected = [produce(t, RECORDS, PARTITIONS, keys=31 + i) for i, t in enumerate(topics)]
    tables = _tables(engine, db, JOBS)
    commits: dict[str, list[float]] = {f"{job_name}-{i}": [] for i in range(JOBS)}

    def on_batch(report: BatchReport) -> None:
        commits[report.job].append(time.monotonic())

    jobs = {
        f"{job_name}-{i}": _counting_job(kafka, db, tables[i], topics[i], 100, on_batch) for i in range(JOBS)
    }
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    assert sorted(result.summaries) == sorted(jobs)
    for i, name in enumerate(jobs):
        summary = result.summaries[name]
        assert summary.records == RECORDS and summary.stopped_by == "caught_up", summary
        assert summary.batches == RECORDS // PARTITIONS // 100
        assert summary.already_committed == 0
        assert totals(engine, tables[i]) == dict(expected[i])
        ends = settled_ends(kafka.bootstrap_servers, topics[i], PARTITIONS)
        assert stored_offsets(engine, db, name) == ends
    # their batches shared Spark jobs: one per round, carrying every batch, fewer than the batches
    batches = sum(s.batches for s in result.summaries.values())
    assert result.round_batches == batches and 1 <= result.rounds < batches, result
    # and a round task committed its jobs' units in one transaction (txn_offsets.commit.commit_units): lineage
    # rows are only inserted, so their xmins are the transactions; fewer than the jobs' batches
    with engine.connect() as conn:
        units, transactions = conn.execute(
            sa.text(
                f'SELECT count(DISTINCT (job, batch)), count(DISTINCT xmin::text) FROM "{db.schema}".commits '
                "WHERE job = ANY(:jobs)"
            ),
            {"jobs": list(jobs)},
        ).one()
    assert units == batches and transactions < units, (units, transactions)
    # and their plans were made together (one Kafka request and transaction each): every plan, from
    # the first (which seeds) to the one that found them caught up
    assert result.plans == batches + JOBS and 1 <= result.joint_plans < result.plans, result
    # and their runs started in joint transactions (as many as JOBS if none overlapped)...
    assert 1 <= result.joint_starts <= JOBS, result
    # ...and all of them released their leases at the end (ended together or alone)
    jobs_table = f'"{db.schema}".jobs'
    with engine.connect() as conn:
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
def test_a_failing_job_fails_alone_in_shared_rounds(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    failure: str,
) -> None:
    """A write that raises in a shared round's task fails its own job's batch only: the other jobs,
    whose units share the round's Spark tasks (and their joint transactions, which then give way to
    a transaction per unit), commit every batch, exact. A write that ends its Python worker fails
    the whole round: each job then runs its next batch in a Spark job of its own, and only the
    failing job fails."""
    good_topics = [topic_factory(partitions=PARTITIONS) for _ in range(3)]
    bad_topic = topic_factory(partitions=PARTITIONS)
    expected = [produce(t, 400, PARTITIONS, keys=17 + i) for i, t in enumerate(good_topics)]
    produce(bad_topic, 400, PARTITIONS)
    tables = _tables(engine, db, 3)
    common = {
        "kafka": kafka,
        "database": db,
        "start": StartPolicy.earliest(),
        "limits": Limits(max_records_per_partition=100),
        "until_caught_up": True,
        "retries": 1,
        "retry_backoff_s": 0.0,
    }
    goods, bad = [f"{job_name}-good{i}" for i in range(3)], f"{job_name}-bad"
    refusing = PartitionWriter(
        write=_refusing_write if failure == "raises" else _exiting_write, aggregate=_count
    )
    jobs = {
        good: {**common, "writer": counting_writer(tables[i]), "topics": [good_topics[i]]}
        for i, good in enumerate(goods)
    }
    result = run_jobs(spark, {**jobs, bad: {**common, "writer": refusing, "topics": [bad_topic]}})
    assert sorted(result.summaries) == goods and sorted(result.errors) == [bad]
    error = result.errors[bad]
    assert isinstance(error, BatchFailed) and error.job == bad
    if failure == "raises":
        assert "RuntimeError: refused" in str(error), error
    for i, good in enumerate(goods):
        # exact either way; a batch of the round that failed whole may have committed before the
        # worker ended, and the summary counts the records of the batches that succeeded
        assert totals(engine, tables[i]) == dict(expected[i])
        assert (
            result.summaries[good].records == 400
            if failure == "raises"
            else result.summaries[good].records > 0
        )
        ends = settled_ends(kafka.bootstrap_servers, good_topics[i], PARTITIONS)
        assert stored_offsets(engine, db, good) == ends
    assert stored_offsets(engine, db, bad) == {(bad_topic, p): 0 for p in range(PARTITIONS)}
    assert result.rounds >= 2  # both jobs' batches went to shared rounds


def test_sigterm_stops_every_job_between_batches(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topics = [topic_factory(partitions=PARTITIONS) for _ in range(JOBS)]
    expected = [produce(t, 400, PARTITIONS) for t in topics]
    tables = _tables(engine, db, JOBS)
    first: dict[str, threading.Event] = {f"{job_name}-{i}": threading.Event() for i in range(JOBS)}

    def on_batch(report: BatchReport) -> None:
        first[report.job].set()

    def kill_when_all_ran() -> None:
        for event in first.values():
            event.wait(60)
        # only with run_jobs' handler installed: the default SIGTERM would end pytest
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signal.SIGTERM)

    jobs = {
        name: {
            "kafka": kafka,
            "database": db,
            "writer": counting_writer(tables[i]),
            "topics": [topics[i]],
            "start": StartPolicy.earliest(),
            "batch_interval_s": 0.2,  # following: only a signal stops them
            "on_batch": on_batch,
        }
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
        assert totals(engine, tables[i]) == dict(expected[i])  # whole batches only, all of them


def test_bad_arguments_start_nothing(
    spark: Any, engine: sa.Engine, kafka: KafkaSettings, db: DatabaseSettings, job_name: str
) -> None:
    with pytest.raises(ConfigError, match="no job given"):
        run_jobs(spark, {})
    with pytest.raises(ConfigError, match=r"jobs\['a'\].*stop is set by run_jobs"):
        run_jobs(spark, {"a": {"kafka": kafka, "database": db, "stop": threading.Event()}})
    # jobs that each fit the server's connections but together do not: refused before any starts
    with engine.connect() as conn:
        free = connection_headroom(conn).free
    many = {
        f"{job_name}-{i}": {"kafka": kafka, "database": db, "writer": None, "topics": []}
        for i in range(free // DRIVER_CONNECTIONS + 1)
    }
    with pytest.raises(ConfigError, match=rf"jobs: these {len(many)} jobs open up to"):
        run_jobs(spark, many)
    # a job that fails does not stop the other; the error names the job
    result = run_jobs(spark, {"bad": {"kafka": kafka, "database": db, "writer": None, "topics": []}})
    assert not result.summaries and isinstance(result.errors["bad"], ConfigError)
    with pytest.raises(JobsFailed, match="'bad': ConfigError"):
        result.raise_for_errors()


def test_a_missing_topic_fails_its_job_alone_before_it_starts(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    """run_jobs checks the jobs' topics together; one job naming a topic that does not exist fails
    alone with TopicMissing, before its run started (no generation bumped), and the other job runs."""
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(topic, 200, PARTITIONS, keys=13)
    (table,) = _tables(engine, db, 1)
    good, bad = f"{job_name}-good", f"{job_name}-bad"
    common = {"kafka": kafka, "database": db, "start": StartPolicy.earliest(), "until_caught_up": True}
    result = run_jobs(
        spark,
        {
            good: {**common, "writer": counting_writer(table), "topics": [topic]},
            bad: {**common, "writer": counting_writer(table), "topics": [topic, f"{topic}-missing"]},
        },
    )
    assert sorted(result.summaries) == [good] and sorted(result.errors) == [bad]
    assert isinstance(result.errors[bad], TopicMissing) and f"{topic}-missing" in str(result.errors[bad])
    assert totals(engine, table) == dict(expected)
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.text(f'SELECT count(*) FROM "{db.schema}".jobs WHERE job = :job'), {"job": bad}
            ).scalar_one()
            == 0
        )  # never started


def test_the_first_round_waits_for_a_job_whose_start_is_slow(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    """One job's run starts late (its job row is locked for a while: start_run waits on it): the
    first round waits for its first batch instead of leaving it to a round of its own, so every
    job's first batch commits in the same round (before: the late job's a round later)."""
    topics = [topic_factory(partitions=PARTITIONS) for _ in range(3)]
    for i, topic in enumerate(topics):
        produce(topic, 4_000, PARTITIONS, keys=5 + i)
    tables = _tables(engine, db, 3)
    names = [f"{job_name}-{i}" for i in range(3)]
    late = names[2]
    end_run(engine, db, start_run(engine, db, late))  # its row exists, its lease released
    first: dict[str, float] = {}

    def on_batch(report: BatchReport) -> None:
        first.setdefault(report.job, time.monotonic())

    jobs = {
        name: _counting_job(kafka, db, tables[i], topics[i], 1_000, on_batch) for i, name in enumerate(names)
    }
    jobs_table = f'"{db.schema}".jobs'
    held = threading.Event()

    def hold_the_late_job() -> None:
        with engine.begin() as conn:
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
