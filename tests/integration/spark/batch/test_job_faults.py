"""The Spark path under the conditions of real topics and real failures: aborted transactions,
compaction, marker-only ranges, partitions added mid-run, deleted records, retried tasks, poison."""

from __future__ import annotations

import collections
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, key_of, stored_offsets, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed, DataLoss, RecordRejected
from txn_offsets.kafka.reader import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.spark.writers import PartitionWriter


def test_aborted_transactions_and_marker_only_ranges(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=4)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    expected: collections.Counter[str] = collections.Counter()
    for txn in range(60):
        abort = txn % 10 == 3  # ~10% aborted
        producer.begin_transaction()
        for i in range(50):
            key = f"k{(txn * 50 + i) % 13}"
            producer.produce(topic, key=key.encode(), value=b"1", partition=(txn + i) % 4)
            if not abort:
                expected[key] += 1
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    settled_ends(kafka, topic, 4)
    summary = run_test_job(
        counting_writer(counts_table), [topic], limits=Limits(max_records_per_partition=97)
    )
    assert totals(engine, counts_table) == dict(expected)
    assert summary.records == sum(expected.values())
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)
    # then only an aborted transaction arrives: the next range holds nothing but an aborted record
    # and its marker, and must still commit and advance the offset
    producer.begin_transaction()
    producer.produce(topic, key=b"never", value=b"1", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    # the planner must see the abort marker, or it plans nothing (the LSO still at the aborted record)
    settled_ends(kafka, topic, 4)
    tail = run_test_job(counting_writer(counts_table), [topic], start=None)
    assert (tail.batches, tail.records) == (1, 0)
    assert [(r.range.span, r.outcome) for r in tail.outcomes] == [(2, "committed")]
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)
    assert totals(engine, counts_table) == dict(expected)


def test_compacted_topic_counts_what_is_left(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    import time

    topic = topic_factory(
        partitions=2,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
        },
    )
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for round_ in range(15):
        for k in range(6):
            producer.produce(topic, key=f"c{k}".encode(), value=str(round_).encode(), partition=k % 2)
        producer.flush(30)
        time.sleep(0.15)
    # wait until the cleaner has compacted and the log is stable (two equal reads): the closed
    # segments are then clean and nothing rolls without new writes
    deadline = time.monotonic() + 90
    previous: collections.Counter[str] = collections.Counter()
    oracle = _oracle_from_kafka(kafka, topic, 2)
    while time.monotonic() < deadline and (sum(oracle.values()) == 90 or oracle != previous):
        time.sleep(2)
        previous, oracle = oracle, _oracle_from_kafka(kafka, topic, 2)
    assert sum(oracle.values()) < 90, "the cleaner never compacted the topic"
    run_test_job(counting_writer(counts_table), [topic])
    assert totals(engine, counts_table) == dict(oracle)
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2)


def _oracle_from_kafka(kafka: KafkaSettings, topic: str, partitions: int) -> collections.Counter[str]:
    from txn_offsets.kafka.reader import read_range

    out: collections.Counter[str] = collections.Counter()
    for (t, p), end in settled_ends(kafka, topic, partitions).items():
        for rec in read_range(kafka, OffsetRange(t, p, 0, end)):
            out[key_of(rec)] += 1
    return out


def test_partitions_added_mid_run_start_at_zero(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 2_000, 2)
    # start=latest for the first run: only what arrives later is counted
    run_test_job(counting_writer(counts_table), [topic], start=StartPolicy.latest())
    assert totals(engine, counts_table) == {}
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    expected = produce(topic, 4_000, 4, start=10_000)
    run_test_job(counting_writer(counts_table), [topic], start=None)
    assert totals(engine, counts_table) == dict(expected)  # new partitions read from offset 0
    stored = stored_offsets(engine, db, job_name)
    assert stored == settled_ends(kafka, topic, 4)
    with engine.connect() as conn:
        seeds = conn.execute(
            sa.text(
                f'SELECT part, new_off FROM "{db.schema}".offset_audit WHERE job = :j AND topic = :t '
                "AND action = 'new_partition' ORDER BY part"
            ),
            {"j": job_name, "t": topic},
        ).all()
    assert [(p, o) for p, o in seeds] == [(2, 0), (3, 0)]


def test_deleted_records_fail_by_default_and_skip_when_asked(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=1)
    produce(topic, 100, 1)
    run_test_job(counting_writer(counts_table), [topic])
    before = totals(engine, counts_table)
    produce(topic, 100, 1, start=100)  # offsets 100..199, not yet processed
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for fut in admin.delete_records([TopicPartition(topic, 0, 150)]).values():
        fut.result(30)
    with pytest.raises(DataLoss) as info:
        run_test_job(counting_writer(counts_table), [topic], start=None)
    assert (info.value.topic, info.value.partition, info.value.stored, info.value.log_start) == (
        topic,
        0,
        100,
        150,
    )
    assert totals(engine, counts_table) == before  # nothing changed
    assert stored_offsets(engine, db, job_name) == {(topic, 0): 100}
    summary = run_test_job(counting_writer(counts_table), [topic], start=None, on_data_loss="skip")
    assert summary.records == 50
    assert sum(totals(engine, counts_table).values()) == 150
    with engine.connect() as conn:
        audit = conn.execute(
            sa.text(
                f'SELECT old_off, new_off FROM "{db.schema}".offset_audit WHERE job = :j '
                "AND action = 'data_loss_skip'"
            ),
            {"j": job_name},
        ).all()
    assert [tuple(a) for a in audit] == [(100, 150)]


def strict_key(record: Record) -> str:
    """The counting decoder, refusing records without a key (the poison of these tests)."""
    if record.key is None:
        raise ValueError("record has no key")
    return record.key.decode()


def fail_first_attempt(rng: OffsetRange, outcome: str) -> None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        raise RuntimeError(f"injected failure after committing {rng} ({outcome})")


def test_task_failing_after_commit_is_retried_into_already_committed(
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
    expected = produce(topic, 4_000, 4)
    base = counting_writer(counts_table)
    writer = PartitionWriter(
        write=base.write, decode=base.decode, aggregate=base.aggregate, after_commit=fail_first_attempt
    )
    summary = run_test_job(
        writer,
        [topic],
        read=ReadOptions(max_tasks=4),  # one range per task: each is committed, then retried
    )
    assert totals(engine, counts_table) == dict(expected)  # counted once despite the retries
    assert summary.already_committed == 4
    assert summary.committed == 0
    assert {r.outcome for r in summary.outcomes} == {"already_committed"}
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)


def test_poison_record_fails_the_batch_and_changes_nothing(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=2)
    produce(topic, 1_000, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic, key=None, value=b"poison", partition=1)
    producer.flush(30)
    poison_offset = settled_ends(kafka, topic, 2)[(topic, 1)] - 1

    base = counting_writer(counts_table)
    writer = PartitionWriter(write=base.write, decode=strict_key, aggregate=base.aggregate)
    with pytest.raises(RecordRejected) as info:
        run_test_job(writer, [topic])
    err = info.value
    assert (err.topic, err.partition, err.offset) == (topic, 1, poison_offset)
    # the exception type, never its message (decoder messages quote payloads); the full text is
    # kept with the record in dead-letter mode
    assert "ValueError (message not shown)" in str(err) and "record has no key" not in str(err)
    # the other partition's range may have committed in the same batch: offsets and results agree
    stored = stored_offsets(engine, db, job_name)
    assert stored[(topic, 1)] == 0
    assert sum(totals(engine, counts_table).values()) == stored[(topic, 0)]


def test_dead_letter_mode_keeps_totals_plus_dead_letters_equal_to_produced(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=2)
    produce(topic, 2_000, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(7):
        producer.produce(topic, key=None, value=f"poison-{i}".encode(), partition=i % 2)
    produce(topic, 1_000, 2, start=2_000)
    producer.flush(30)

    base = counting_writer(counts_table)
    writer = PartitionWriter(write=base.write, decode=strict_key, aggregate=base.aggregate, dead_letters=True)
    summary = run_test_job(writer, [topic], limits=Limits(max_records_per_partition=400))
    with engine.connect() as conn:
        dead = conn.execute(
            sa.text(f'SELECT topic, part, off, value, error FROM "{db.schema}".dead_letters WHERE job = :j'),
            {"j": job_name},
        ).all()
    assert sum(totals(engine, counts_table).values()) + len(dead) == 3_007 == summary.records
    assert sorted(row.value for row in dead) == [f"poison-{i}".encode() for i in range(7)]
    assert all("record has no key" in row.error for row in dead)
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2)


def flaky_write(counter: Path, fail_times: int, inner: Any) -> Any:
    """A write that fails its first `fail_times` calls (across Spark worker processes)."""

    def write(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        with counter.open("a+") as fh:  # one line per call; appends are atomic at this size
            fh.write("x\n")
        if len(counter.read_text().splitlines()) <= fail_times:
            raise RuntimeError("injected write failure")
        inner(conn, rng, counts)

    return write


def test_failed_batch_is_planned_again_and_counted_once(
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
    topic = topic_factory(partitions=2)
    expected = produce(topic, 2_000, 2)
    base = counting_writer(counts_table)
    # 8 failures: more than Spark's 3 attempts of a task, so whole Spark jobs fail (BatchFailed)
    # and the runner plans again from the stored offsets
    writer = PartitionWriter(
        write=flaky_write(tmp_path / "calls", 8, base.write), decode=base.decode, aggregate=base.aggregate
    )
    summary = run_test_job(writer, [topic], retries=5, retry_backoff_s=0.1)
    assert totals(engine, counts_table) == dict(expected)
    assert summary.records == 2_000
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2)


def test_permanent_failure_stops_after_the_retries(
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
    produce(topic, 100, 1)
    base = counting_writer(counts_table)
    writer = PartitionWriter(
        write=flaky_write(tmp_path / "calls", 10**6, base.write), decode=base.decode, aggregate=base.aggregate
    )
    with pytest.raises(BatchFailed, match="injected write failure"):
        run_test_job(writer, [topic], retries=1, retry_backoff_s=0.1)
    assert totals(engine, counts_table) == {}
    assert stored_offsets(engine, db, job_name) == {(topic, 0): 0}
