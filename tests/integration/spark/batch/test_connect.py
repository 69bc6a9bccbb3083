"""The DataFrame execution path (no RDD API) on a real Spark Connect server and on classic Spark:
the same jobs give the same outcomes as the RDD path - exact totals with aborted Kafka transactions,
marker-only ranges committed, retries after commit and replays as no-ops, zombies fenced."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_job_faults import fail_first_attempt
from tests.integration.spark.counting import (
    Counting,
    abort_alone,
    counts_table_of,
    produce_transactions,
    transactional_producer,
)
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed, ConfigError, Fenced
from txn_offsets.kafka.reader import read_range
from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark import frames, runner
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.session import is_connect
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.spark.writers import BatchWriter, PartitionWriter
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run
from txn_offsets.upserts import upsert_add

Session = tuple[Any, str]  # (SparkSession, execution)


@pytest.fixture(params=["connect", "classic-dataframe"])
def session(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Session:
    """A Spark Connect session (auto: the DataFrame path), or classic Spark forced onto it."""
    if request.param == "connect":
        return request.getfixturevalue("connect_spark"), "auto"
    # force the DataFrame path on every Batch run_job builds (whatever execution it passes)
    monkeypatch.setattr(
        runner, "Batch", lambda *a, **k: dataclasses.replace(Batch(*a, **k), execution="dataframe")
    )
    return request.getfixturevalue("spark"), "dataframe"


def count_keys_df(records: Any) -> list[tuple[str, int]]:
    """compute_df of the per-batch job: a shuffle over the batch's DataFrame of records."""
    rows = records.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
    return [(str(r.k), int(r["count"])) for r in rows]


def batch_counts_writer(table: str) -> BatchWriter[list[tuple[str, int]]]:
    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]) -> None:
        upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])

    return BatchWriter(compute_df=count_keys_df, write=write)


@pytest.fixture
def batch_table(engine: sa.Engine, db: DatabaseSettings) -> str:
    """A second counts table, for the per-batch job reading the same topic."""
    name = f'"{db.schema}".batch_counts'
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {name} (k text PRIMARY KEY, n bigint NOT NULL)"))
    return name


def test_sessions_pick_their_path(spark: Any, connect_spark: Any, db: DatabaseSettings) -> None:
    run = Run("paths", 1, "r")
    ranges = (OffsetRange("t", 0, 0, 1),)
    assert is_connect(connect_spark) and not is_connect(spark)
    assert Batch(1, ranges, connect_spark, db, KafkaSettings("x:1"), run).path == "dataframe"
    assert Batch(1, ranges, spark, db, KafkaSettings("x:1"), run).path == "rdd"
    forced = Batch(1, ranges, spark, db, KafkaSettings("x:1"), run, execution="dataframe")
    assert forced.path == "dataframe"
    with pytest.raises(ConfigError, match="Spark Connect has no RDD API"):
        Batch(1, ranges, connect_spark, db, KafkaSettings("x:1"), run, execution="rdd")
    with pytest.raises(ConfigError, match="execution"):
        Batch(1, ranges, spark, db, KafkaSettings("x:1"), run, execution="rdds")
    with pytest.raises(ConfigError, match="exactly one of compute_df"):
        BatchWriter(write=lambda conn, ranges, result: None)


def test_counting_and_per_batch_jobs_are_exact_with_aborted_transactions(
    session: Session, counting: Counting, batch_table: str
) -> None:
    spark, _ = session
    topic, _ = counting.topic(3)
    expected = produce_transactions(counting.kafka, topic, 3)
    ends = counting.ends(topic, 3)
    for job, writer, table in [
        (counting.job, counting.writer(), counting.table),
        (f"{counting.job}-batch", batch_counts_writer(batch_table), batch_table),
    ]:
        limits = Limits(max_records_per_partition=150)
        summary = counting.run(topic, writer=writer, session=spark, job=job, limits=limits)
        assert counting.totals(table) == dict(expected), job
        assert counting.offsets(job) == ends, job
        assert summary.batches >= 2 and summary.committed >= 6
        # partition 0's last range holds only an aborted record and its marker: it committed too
        last = max((r for r in summary.outcomes if r.range.partition == 0), key=lambda r: r.range.until)
        assert (last.range.until, last.outcome) == (ends[(topic, 0)], "committed")
    counted = counting.run(topic, session=spark, start=None)
    assert (counted.batches, counted.records) == (0, 0)  # a restart finds nothing to do


def test_marker_only_range_commits_alone(connect_spark: Any, counting: Counting) -> None:
    topic, expected = counting.topic(1, 200)
    counting.run(topic, session=connect_spark)
    abort_alone(transactional_producer(counting.kafka), topic)
    counting.ends(topic, 1)  # else the planner may see the LSO before the abort marker: no batch
    tail = counting.run(topic, session=connect_spark, start=None)
    assert (tail.batches, tail.records) == (1, 0)
    assert [(r.range.span, r.outcome) for r in tail.outcomes] == [(2, "committed")]
    assert counting.offsets() == counting.ends(topic, 1)
    assert counting.totals() == dict(expected)


def _per_batch(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> list[int]:
    """How many items `seen` gained during each batch's tasks (frames.run_tasks), batch by batch."""
    per_batch: list[int] = []
    real_run_tasks = frames.run_tasks

    def run_tasks(*args: Any, **kwargs: Any) -> Any:
        before = len(seen)
        reports = real_run_tasks(*args, **kwargs)
        per_batch.append(len(seen) - before)
        return reports

    monkeypatch.setattr(frames, "run_tasks", run_tasks)
    return per_batch


def test_a_connect_batch_asks_the_server_for_no_setting(
    connect_spark: Any, counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch under Spark Connect collects its tasks' reports without a Config RPC: the client's
    collect() asks the server for a setting every time (~10 ms, 5-7 % of a small batch)."""
    client = connect_spark.client
    asked: list[Any] = []
    real_config = client.config

    def config(operation: Any) -> Any:
        asked.append(operation)
        return real_config(operation)

    monkeypatch.setattr(client, "config", config)
    per_batch = _per_batch(monkeypatch, asked)
    topic, expected = counting.topic(2, 200)
    summary = counting.run(topic, session=connect_spark, limits=Limits(max_records_per_partition=50))
    assert counting.totals() == dict(expected) and counting.offsets() == counting.ends(topic, 2)
    assert summary.batches == len(per_batch) >= 2
    assert per_batch == [0] * summary.batches


def test_a_connect_batch_collects_its_reports_without_reattachable_execution(
    connect_spark: Any, counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch under Spark Connect collects its tasks' reports without a reattachable execution (a
    ReleaseExecute RPC for each response: ~10 ms of a small batch), on a copy of the session's
    client: the session's own client, which the user's queries share, still reattaches."""
    from pyspark.sql.connect.client import core

    made: list[Any] = []
    real_iterator = core.ExecutePlanResponseReattachableIterator

    def iterator(*args: Any, **kwargs: Any) -> Any:
        made.append(args[0])
        return real_iterator(*args, **kwargs)

    monkeypatch.setattr(core, "ExecutePlanResponseReattachableIterator", iterator)
    per_batch = _per_batch(monkeypatch, made)
    topic, expected = counting.topic(2, 200)
    summary = counting.run(topic, session=connect_spark, limits=Limits(max_records_per_partition=50))
    assert counting.totals() == dict(expected) and counting.offsets() == counting.ends(topic, 2)
    assert summary.batches == len(per_batch) >= 2 and summary.records == 200
    assert per_batch == [0] * summary.batches
    # the user's session is as it was: its own queries still reattach
    assert connect_spark.client._use_reattachable_execute is True
    before = len(made)  # (the session's set-up may have run queries of its own before the job)
    connect_spark.range(3).collect()
    assert len(made) == before + 1


def test_a_classic_run_builds_one_dataframe_for_its_batches(
    spark: Any, counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a classic session the DataFrame path builds the mapInArrow DataFrame of a run once (a new
    one per batch cost 46-49 ms of a ~200 ms small batch); each batch's tasks still read and commit
    that batch's own ranges, its lineage rows under its own batch number."""
    frames_class = type(spark.range(1))  # classic PySpark's DataFrame
    built: list[Any] = []
    real_map = frames_class.mapInArrow

    def map_in_arrow(self: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(args[0])
        return real_map(self, *args, **kwargs)

    monkeypatch.setattr(frames_class, "mapInArrow", map_in_arrow)
    monkeypatch.setattr(
        runner, "Batch", lambda *a, **k: dataclasses.replace(Batch(*a, **k), execution="dataframe")
    )
    per_batch = _per_batch(monkeypatch, built)
    topic, expected = counting.topic(2, 200)
    summary = counting.run(topic, session=spark, limits=Limits(max_records_per_partition=25))
    assert counting.totals() == dict(expected) and counting.offsets() == counting.ends(topic, 2)
    assert summary.batches == len(per_batch) >= 4 and summary.records == 200
    assert per_batch == [1] + [0] * (summary.batches - 1)
    lineage = counting.rows("SELECT batch, count(*) FROM {schema}.commits WHERE job = :j GROUP BY batch")
    assert sorted(n for _, n in lineage) == [2] * summary.batches  # a batch: one range a partition
    assert len({b for b, _ in lineage}) == summary.batches
    # a second run of the same job (a new generation: another task) builds its own
    more = counting.produce(topic, 50, 2)
    again = counting.run(topic, session=spark, start=None, limits=Limits(max_records_per_partition=25))
    assert again.records == 50 and per_batch[summary.batches] == 1
    assert counting.totals() == dict(expected + more)


def test_replay_is_a_no_op_and_a_zombie_is_fenced(session: Session, counting: Counting) -> None:
    spark, execution = session
    topic, expected = counting.topic(2, 600)
    db, kafka, job_name = counting.db, counting.kafka, counting.job
    eng = engine_for(db)
    run = start_run(Store(eng, db), job_name)
    plan = counting.first_plan(eng, topic)
    batch = Batch(1, plan.ranges, spark, db, kafka, run, execution=execution)
    assert batch.path == "dataframe"
    first = counting.writer().commit(batch)
    again = counting.writer().commit(batch)  # a retried batch after a lost answer
    per_batch = batch_counts_writer(counting.table).commit(batch)
    assert [r.outcome for r in first] == ["committed", "committed"]
    assert [(r.outcome, r.records) for r in again] == [("already_committed", 300)] * 2
    assert [r.outcome for r in per_batch] == ["already_committed"] * 2
    assert counting.totals() == dict(expected)
    # a new run fences this one: its tasks report Fenced, with its context, and write nothing
    newer = start_run(Store(eng, db), job_name, force=True)
    counting.produce(topic, 100, 2, start=600)
    plan = plan_batch(
        Store(eng, db), kafka, job=job_name, selection=TopicSelection((topic,)), start=None, limits=Limits()
    )
    zombie = Batch(2, plan.ranges, spark, db, kafka, run, execution=execution)
    for writer in (counting.writer(), batch_counts_writer(counting.table)):
        reports = writer.commit(zombie)
        assert {r.outcome for r in reports} == {"fenced"}
        err = reports[0].error
        assert isinstance(err, Fenced)
        assert (err.job, err.generation, err.current) == (job_name, run.generation, newer.generation)
    eng.dispose()
    assert counting.totals() == dict(expected)
    assert set(counting.offsets().values()) == {300}


def test_records_frame_holds_every_record_field(
    connect_spark: Any, db: DatabaseSettings, kafka: KafkaSettings, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    # explicit timestamps, recent ones: records older than the topic's retention would be deleted
    now_ms = int(time.time() * 1000)
    producer.produce(topic, key=b"a", value=b"1", partition=0, timestamp=now_ms - 1234, headers=[("h", b"x")])
    producer.produce(topic, key=None, value=None, partition=1, timestamp=now_ms - 567)
    producer.produce(topic, key=b"c", value=b"3", partition=1, headers=[("h", None), ("i", b"")])
    assert producer.flush(30) == 0
    ranges = tuple(OffsetRange(t, p, 0, end) for (t, p), end in sorted(settled_ends(kafka, topic, 2).items()))
    batch = Batch(1, ranges, connect_spark, db, kafka, Run("frame", 1, "r"))
    rows = batch.records_frame().orderBy("partition", "offset").collect()
    expected = [rec for rng in ranges for rec in read_range(kafka, rng)]
    assert [
        (
            r.topic,
            r.partition,
            r.offset,
            r.key,
            r.value,
            int(r.timestamp.timestamp() * 1000),
            tuple((h.key, h.value) for h in r.headers),
        )
        for r in rows
    ] == [tuple(rec) for rec in expected]


def test_task_retried_after_commit_finds_it_already_committed(connect_spark: Any, counting: Counting) -> None:
    topic, expected = counting.topic(2, 400)
    summary = counting.run(
        topic,
        writer=counting.writer(after_commit=fail_first_attempt),
        session=connect_spark,
        read=ReadOptions(max_tasks=2),  # one range per task: each commits, fails, and is retried
    )
    assert [r.outcome for r in summary.outcomes] == ["already_committed"] * 2
    assert counting.totals() == dict(expected)
    assert counting.offsets() == counting.ends(topic, 2)


def test_missing_module_on_the_workers_names_the_fix(
    spark: Any, connect_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    """A write function from a module only the client can import (as a job's module that was never
    installed on the cluster): a ConfigError that says so; shipped with addArtifacts, it runs."""
    module = f"txn_job_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "import collections\ndef count(keys):\n    return collections.Counter(keys)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        aggregate = __import__(module).count
    finally:
        sys.path.remove(str(tmp_path))
    topic, expected = counting.topic(1, 100)
    writer = counting.writer(aggregate=aggregate)
    with pytest.raises(ConfigError, match=rf"cannot import module '{module}'.*spark.addArtifacts"):
        counting.run(topic, writer=writer, session=connect_spark)
    assert counting.offsets() == {(topic, 0): 0}
    # RDD functions are refused before anything runs, naming the DataFrame variant
    rdd_writer = BatchWriter(compute=lambda records: records.count(), write=lambda conn, ranges, n: None)
    with pytest.raises(ConfigError, match="compute_df"):
        counting.run(topic, writer=rdd_writer, session=connect_spark, start=None)
    # on a session of its own: the shared session must not carry this test's module into later
    # tests (a Spark thread that inherits a session's artifact state fetches its files, and this
    # file is gone once the test's tmp_path is)
    from txn_offsets.spark.session import connect_client

    own = connect_client(spark)
    try:
        own.addArtifacts(str(tmp_path / f"{module}.py"), pyfile=True)
        counting.run(topic, writer=writer, session=own, start=None)
    finally:
        own.stop()
    assert counting.totals() == dict(expected)


def test_batch_timeout_interrupts_a_connect_batch(
    connect_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    """Under Connect the deadline interrupts the batch by its operation tag: Spark kills the task's
    Python worker (which would otherwise commit after its sleep) and nothing is committed."""
    topic, _ = counting.topic(1, 50)
    pid_file = tmp_path / "pid"
    writer = PartitionWriter(write=functools.partial(_sleepy_write, pid_file))
    started = time.monotonic()
    # 8 s: a Connect server's first batch (a Python worker started, txn_offsets imported, Kafka
    # read) took over 3 s on a busy 2-core machine, so the batch timed out before its write
    with pytest.raises(BatchFailed, match="batch_timeout_s=8s"):
        counting.run(topic, writer=writer, session=connect_spark, batch_timeout_s=8, retries=0)
    assert time.monotonic() - started < 30  # the write sleeps 40 s: it was interrupted
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), "the interrupted task's Python worker is still running"
    assert counting.offsets() == {(topic, 0): 0}


def _sleepy_write(pid_file: Path, conn: sa.Connection, rng: OffsetRange, values: Any) -> None:
    pid_file.write_text(str(os.getpid()))
    time.sleep(40)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by the Spark daemon) is gone for our purpose, and so is a
    # process reaped between the signal and the read (the read then fails: ProcessLookupError)
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_a_process_reaped_while_its_status_is_read_is_not_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI of b755a08 failed here: the killed worker was reaped between _alive's signal and its read
    of /proc/<pid>/status, and the read raised ProcessLookupError instead of saying "gone"."""

    def reaped(self: Path, *args: Any, **kwargs: Any) -> str:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(Path, "read_text", reaped)
    assert _alive(os.getpid()) is False
