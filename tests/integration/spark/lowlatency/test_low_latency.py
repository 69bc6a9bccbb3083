"""run_job in low-latency mode (``low_latency=LowLatency(...)``) on the real stack: exact while a
producer writes, a fenced zombie, the epoch bound and a restart from the table, a task Spark
retries, BatchWriter refused. Each runs in seconds on the shared local[2,3] session."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from tests.integration.spark.counting import (
    Counting,
    count_keys,
    counting_writer,
    counts_table_of,
    key_of,
)
from txn_offsets import (
    BatchWriter,
    ConfigError,
    Fenced,
    JobSummary,
    Limits,
    LowLatency,
    PartitionWriter,
    StartPolicy,
)
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.plan.planner import TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.lowlatency.follow import FollowTask
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run
from txn_offsets.upserts import upsert_add

FAST = LowLatency(epoch_s=30, commit_interval_ms=10, check_interval_ms=100)


class TransactionalProducer:
    """Kafka transactions of `size` records over `partitions` partitions, every `abort_every`-th
    aborted; `expected` counts the committed keys."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, *, size: int = 5, abort_every: int = 7
    ) -> None:
        self.topic, self.partitions, self.size, self.abort_every = topic, partitions, size, abort_every
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"ll-{uuid.uuid4().hex[:8]}", "linger.ms": 0}
        )
        self.producer.init_transactions(30)
        self.expected: collections.Counter[str] = collections.Counter()
        self.sent = 0
        self.transactions = 0

    def transaction(self) -> None:
        self.transactions += 1
        self.producer.begin_transaction()
        keys = []
        for _ in range(self.size):
            i = self.sent
            self.sent += 1
            key = f"k{(i * 7919) % 31}"
            keys.append(key)
            self.producer.produce(self.topic, key=key.encode(), value=b"1", partition=i % self.partitions)
        if self.transactions % self.abort_every == 0:
            self.producer.abort_transaction(30)
        else:
            self.producer.commit_transaction(30)
            self.expected.update(keys)

    def close(self) -> None:
        self.producer.flush(30)


def run_in_thread(run: Callable[[], JobSummary]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["summary"] = run()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, result


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)


def wait_for_ends(
    counting: Counting, topic: str, partitions: int, timeout_s: float
) -> dict[tuple[str, int], int]:
    """The topic's ends, once the job's stored offsets have reached them (within `timeout_s`)."""
    ends = counting.ends(topic, partitions)
    wait_for(lambda: counting.offsets() == ends, timeout_s, f"the stored offsets to reach {ends}")
    return ends


def test_exact_while_a_producer_writes(counting: Counting, kafka_bootstrap: str) -> None:
    topic, _ = counting.topic(4)
    producer = TransactionalProducer(kafka_bootstrap, topic, 4)
    for _ in range(40):  # a backlog before the start, the rest while it runs
        producer.transaction()
    stop = threading.Event()
    thread, result = run_in_thread(
        lambda: counting.run(
            topic,
            until_caught_up=False,
            stop=stop,
            low_latency=FAST,
            mirror_group=counting.job,
        )
    )
    for _ in range(160):
        producer.transaction()
        time.sleep(0.01)
    producer.close()
    ends = wait_for_ends(counting, topic, 4, 30)
    stop.set()
    thread.join(60)
    assert "error" not in result, result.get("error")
    summary: JobSummary = result["summary"]
    assert counting.totals() == dict(producer.expected)
    assert summary.records == sum(producer.expected.values())
    assert summary.stopped_by == "signal"
    assert summary.batches == 1  # one epoch
    # the offsets reached the ends while it ran (above), not at its stop: commits while producing
    assert summary.committed >= 2
    assert group_offsets(counting.kafka, counting.job) == ends  # the consumer-group mirror of the table


def test_bounded_epoch_then_a_restart_from_the_table(counting: Counting) -> None:
    topic, expected = counting.topic(3, 3000)
    started = time.monotonic()
    first = counting.run(
        topic,
        until_caught_up=False,
        max_batches=1,
        low_latency=LowLatency(epoch_s=3, check_interval_ms=100),
    )
    assert first.stopped_by == "max_batches" and first.batches == 1
    assert time.monotonic() - started >= 3
    assert sum(counting.totals().values()) == first.records  # what the epoch committed
    more = counting.produce(topic, 600, 3, start=3000)
    second = counting.run(topic, start=None, low_latency=FAST)
    assert second.generation == first.generation + 1
    assert second.stopped_by == "caught_up"
    assert first.records + second.records == 3600
    assert counting.totals() == dict(expected + more)
    assert sum(counting.offsets().values()) == 3600


def test_a_newer_run_fences_the_epoch(counting: Counting, kafka_bootstrap: str) -> None:
    topic, _ = counting.topic(2)
    producer = TransactionalProducer(kafka_bootstrap, topic, 2, abort_every=1000)
    stop = threading.Event()
    thread, result = run_in_thread(
        lambda: counting.run(topic, until_caught_up=False, stop=stop, low_latency=FAST)
    )
    wait_for(lambda: bool(counting.offsets()), 30, "the first plan")
    for _ in range(20):
        producer.transaction()
    wait_for(lambda: sum(counting.totals().values()) == 100, 30, "the first records")
    # a newer run: the live one is now a zombie
    start_run(Store(counting.engine, counting.db), counting.job, force=True)
    for _ in range(20):
        producer.transaction()  # records the zombie must not apply
    producer.close()
    thread.join(30)
    stop.set()
    assert not thread.is_alive()
    assert isinstance(result.get("error"), Fenced), result
    time.sleep(0.5)
    assert counting.totals() == dict(collections.Counter(f"k{(i * 7919) % 31}" for i in range(100)))
    # 100 records and a marker per transaction and partition: nothing after the fencing
    assert sum(counting.offsets().values()) == 100 + 20 * 2


def test_a_task_spark_retries_continues_from_the_table(counting: Counting, tmp_path: Path) -> None:
    topic, expected = counting.topic(2, 2000)
    marker = tmp_path / "failed-once"
    target = counts_table_of(counting.table)

    def write(conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"])
        if rng.partition == 1 and rng.start > 0 and not marker.exists():
            marker.touch()
            raise RuntimeError("the user's write fails once")  # the transaction rolls back

    writer = PartitionWriter(write=write, decode=key_of, aggregate=count_keys)
    summary = counting.run(topic, writer=writer, low_latency=LowLatency(epoch_s=30, commit_max_records=200))
    assert marker.exists()  # it failed once, and Spark ran the task again
    assert summary.stopped_by == "caught_up"
    assert counting.totals() == dict(expected)


def test_batch_writer_is_refused(counting: Counting) -> None:
    topic, _ = counting.topic(1)
    writer: BatchWriter[Any] = BatchWriter(write=lambda conn, ranges, result: None, compute_df=lambda df: [])
    with pytest.raises(ConfigError, match="needs a PartitionWriter, got BatchWriter"):
        counting.run(topic, writer=writer, low_latency=FAST)
    with counting.engine.connect() as conn:  # refused before the run started: no generation, no offsets
        jobs = conn.execute(sa.text(f'SELECT count(*) FROM "{counting.db.schema}".jobs')).scalar_one()
    assert jobs == 0
    assert counting.offsets() == {}


def test_a_task_started_late_ends_with_its_epoch(
    engine: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings, topic_factory: TopicFactory, job_name: str
) -> None:
    """A task Spark retries (or starts) late in an epoch ends at the epoch's end, not epoch_s after its
    own start - else it outlives the driver's bound and the epoch is cancelled (found by F18) - but
    runs a quarter of an epoch or 5 s. The task body in this process: no Spark needed."""
    topic = topic_factory(partitions=1)
    run = start_run(Store(engine, db), job_name)
    selection = TopicSelection((topic,))
    plan = plan_batch(
        Store(engine, db),
        kafka,
        job=job_name,
        selection=selection,
        start=StartPolicy.earliest(),
        limits=Limits(),
        run=run,
    )
    writer = counting_writer('"x".unused')
    for epoch_s, ends_in, expected in ((12.0, 2.0, (4.5, 9.0)),):
        task = FollowTask(
            database=db,
            kafka=kafka,
            run=run,
            partitions=tuple(sorted(plan.stored)),
            ends={},
            options=LowLatency(epoch_s=epoch_s, check_interval_ms=100),
            prepare=writer.prepare,
            write=writer.write_ranges,
            ends_at=time.time() + ends_in,
        )
        t0 = time.monotonic()
        (report,) = task(0, [(0,)])
        took = time.monotonic() - t0
        assert report.stopped_by == "deadline"
        assert expected[0] <= took < expected[1], (epoch_s, ends_in, took)


def test_a_commit_per_producer_transaction_over_the_tasks_partitions(
    counting_no_spark: Counting, kafka_bootstrap: str
) -> None:
    """A producer transaction over the task's 4 partitions arrives within a millisecond: one commit
    for all of it (the range that is due takes the others along), not one for the partition whose
    record the poll's wait returned first and one for the rest after it. The task body in this
    process: no Spark needed."""
    from txn_offsets.spark.lowlatency.control import end_epoch

    topic, _ = counting_no_spark.topic(4)
    run = start_run(Store(counting_no_spark.engine, counting_no_spark.db), counting_no_spark.job)
    plan = counting_no_spark.first_plan(counting_no_spark.engine, topic, run=run)
    writer = counting_no_spark.writer()
    task = FollowTask(
        database=counting_no_spark.db,
        kafka=counting_no_spark.kafka,
        run=run,
        partitions=tuple(sorted(plan.stored)),
        ends={},
        # a transaction's 4 partitions become readable as the coordinator writes each one's commit
        # marker: within a millisecond idle, but CI (2 busy cores) once saw them >5 ms apart and
        # got 11 commits; 50 ms still keeps the transactions, 200 ms apart, one commit each
        options=LowLatency(epoch_s=30, commit_interval_ms=50, check_interval_ms=100),
        prepare=writer.prepare,
        write=writer.write_ranges,
    )
    reports: list[Any] = []
    thread = threading.Thread(target=lambda: reports.extend(task(0, [(0, 1, 2, 3)])), daemon=True)
    thread.start()
    producer = TransactionalProducer(kafka_bootstrap, topic, 4, size=8, abort_every=1000)
    for _ in range(10):
        producer.transaction()
        time.sleep(0.2)
    producer.close()
    wait_for_ends(counting_no_spark, topic, 4, 15)
    end_epoch(Store(counting_no_spark.engine, counting_no_spark.db), run)
    thread.join(30)
    (report,) = reports
    assert report.error is None and report.stopped_by == "ended"
    assert counting_no_spark.totals() == dict(producer.expected)
    assert sum(s.records for s in report.spans) == 80
    # 10 transactions of 2 records on each of 4 partitions, 200 ms apart: a commit each
    assert report.commits <= producer.transactions, f"{report.commits} commits for 10 producer transactions"
