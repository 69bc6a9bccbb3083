"""The Spark path under the conditions of real topics and real failures: aborted transactions,
compaction, marker-only ranges, partitions added mid-run, deleted records, retried tasks, poison."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.integration.spark.counting import (
    Counting,
    abort_alone,
    key_of,
    produce_transactions,
    transactional_producer,
)
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import BatchFailed, DataLoss, RecordRejected
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import ReadOptions


def test_aborted_transactions_and_marker_only_ranges(counting: Counting) -> None:
    topic, _ = counting.topic(4)
    expected = produce_transactions(
        counting.kafka, topic, 4, transactions=60, size=50, keys=13, then_abort_alone=False
    )
    summary = counting.run(topic, limits=Limits(max_records_per_partition=97))
    assert counting.totals() == dict(expected)
    assert summary.records == sum(expected.values())
    assert counting.offsets() == counting.ends(topic, 4)
    # then only an aborted transaction arrives: the next range holds nothing but an aborted record
    # and its marker, and must still commit and advance the offset
    abort_alone(transactional_producer(counting.kafka), topic)
    # the planner must see the abort marker, or it plans nothing (the LSO still at the aborted record)
    counting.ends(topic, 4)
    tail = counting.run(topic, start=None)
    assert (tail.batches, tail.records) == (1, 0)
    assert [(r.range.span, r.outcome) for r in tail.outcomes] == [(2, "committed")]
    assert counting.offsets() == counting.ends(topic, 4)
    assert counting.totals() == dict(expected)


def test_compacted_topic_counts_what_is_left(counting: Counting) -> None:
    import time

    compacted = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }
    topic, _ = counting.topic(2, config=compacted)
    producer = Producer({"bootstrap.servers": counting.kafka.bootstrap_servers})
    for round_ in range(15):
        for k in range(6):
            producer.produce(topic, key=f"c{k}".encode(), value=str(round_).encode(), partition=k % 2)
        producer.flush(30)
        time.sleep(0.15)
    # wait until the cleaner has compacted and the log is stable (two equal reads): the closed
    # segments are then clean and nothing rolls without new writes
    deadline = time.monotonic() + 90
    previous: collections.Counter[str] = collections.Counter()
    oracle = _oracle_from_kafka(counting.kafka, topic, 2)
    while time.monotonic() < deadline and (sum(oracle.values()) == 90 or oracle != previous):
        time.sleep(2)
        previous, oracle = oracle, _oracle_from_kafka(counting.kafka, topic, 2)
    assert sum(oracle.values()) < 90, "the cleaner never compacted the topic"
    counting.run(topic)
    assert counting.totals() == dict(oracle)
    assert counting.offsets() == counting.ends(topic, 2)


def _oracle_from_kafka(kafka: KafkaSettings, topic: str, partitions: int) -> collections.Counter[str]:
    from txn_offsets.kafka.reader import read_range

    out: collections.Counter[str] = collections.Counter()
    for (t, p), end in settled_ends(kafka, topic, partitions).items():
        for rec in read_range(kafka, OffsetRange(t, p, 0, end)):
            out[key_of(rec)] += 1
    return out


def test_partitions_added_mid_run_start_at_zero(counting: Counting) -> None:
    topic, expected = counting.topic(2, 2_000)
    # start=latest for the first run: only what arrives later is counted
    counting.run(topic, start=StartPolicy.latest())
    assert counting.totals() == {}
    admin = AdminClient({"bootstrap.servers": counting.kafka.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    expected = counting.produce(topic, 4_000, 4, start=10_000)
    counting.run(topic, start=None)
    assert counting.totals() == dict(expected)  # new partitions read from offset 0
    stored = counting.offsets()
    assert stored == counting.ends(topic, 4)
    seeds = counting.rows(
        'SELECT part, new_off FROM "{schema}".offset_audit '
        "WHERE job = :j AND topic = :t AND action = 'new_partition' ORDER BY part",
        t=topic,
    )
    assert [(p, o) for p, o in seeds] == [(2, 0), (3, 0)]


def test_deleted_records_fail_by_default_and_skip_when_asked(counting: Counting) -> None:
    topic, _ = counting.topic(1, 100)
    counting.run(topic)
    before = counting.totals()
    counting.produce(topic, 100, 1, start=100)  # offsets 100..199, not yet processed
    admin = AdminClient({"bootstrap.servers": counting.kafka.bootstrap_servers})
    for fut in admin.delete_records([TopicPartition(topic, 0, 150)]).values():
        fut.result(30)
    with pytest.raises(DataLoss) as info:
        counting.run(topic, start=None)
    assert (info.value.topic, info.value.partition, info.value.stored, info.value.log_start) == (
        topic,
        0,
        100,
        150,
    )
    assert counting.totals() == before  # nothing changed
    assert counting.offsets() == {(topic, 0): 100}
    summary = counting.run(topic, start=None, on_data_loss="skip")
    assert summary.records == 50
    assert sum(counting.totals().values()) == 150
    audit = counting.rows(
        "SELECT old_off, new_off FROM \"{schema}\".offset_audit WHERE job = :j AND action = 'data_loss_skip'"
    )
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


def test_task_failing_after_commit_is_retried_into_already_committed(counting: Counting) -> None:
    topic, expected = counting.topic(4, 4_000)
    summary = counting.run(
        topic,
        writer=counting.writer(after_commit=fail_first_attempt),
        read=ReadOptions(max_tasks=4),  # one range per task: each is committed, then retried
    )
    assert counting.totals() == dict(expected)  # counted once despite the retries
    assert summary.already_committed == 4
    assert summary.committed == 0
    assert {r.outcome for r in summary.outcomes} == {"already_committed"}
    assert counting.offsets() == counting.ends(topic, 4)


def test_poison_record_fails_the_batch_and_changes_nothing(counting: Counting) -> None:
    topic, _ = counting.topic(2, 1_000)
    producer = Producer({"bootstrap.servers": counting.kafka.bootstrap_servers})
    producer.produce(topic, key=None, value=b"poison", partition=1)
    producer.flush(30)
    poison_offset = counting.ends(topic, 2)[(topic, 1)] - 1

    with pytest.raises(RecordRejected) as info:
        counting.run(topic, writer=counting.writer(decode=strict_key))
    err = info.value
    assert (err.topic, err.partition, err.offset) == (topic, 1, poison_offset)
    # the exception type, never its message (decoder messages quote payloads); the full text is
    # kept with the record in dead-letter mode
    assert "ValueError (message not shown)" in str(err) and "record has no key" not in str(err)
    # the other partition's range may have committed in the same batch: offsets and results agree
    stored = counting.offsets()
    assert stored[(topic, 1)] == 0
    assert sum(counting.totals().values()) == stored[(topic, 0)]


def test_dead_letter_mode_keeps_totals_plus_dead_letters_equal_to_produced(counting: Counting) -> None:
    topic, _ = counting.topic(2, 2_000)
    producer = Producer({"bootstrap.servers": counting.kafka.bootstrap_servers})
    for i in range(7):
        producer.produce(topic, key=None, value=f"poison-{i}".encode(), partition=i % 2)
    counting.produce(topic, 1_000, 2, start=2_000)
    producer.flush(30)

    writer = counting.writer(decode=strict_key, dead_letters=True)
    summary = counting.run(topic, writer=writer, limits=Limits(max_records_per_partition=400))
    dead = counting.rows('SELECT topic, part, off, value, error FROM "{schema}".dead_letters WHERE job = :j')
    assert sum(counting.totals().values()) + len(dead) == 3_007 == summary.records
    assert sorted(row.value for row in dead) == [f"poison-{i}".encode() for i in range(7)]
    assert all("record has no key" in row.error for row in dead)
    assert counting.offsets() == counting.ends(topic, 2)


def flaky_write(counter: Path, fail_times: int, inner: Any) -> Any:
    """A write that fails its first `fail_times` calls (across Spark worker processes)."""

    def write(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        with counter.open("a+") as fh:  # one line per call; appends are atomic at this size
            fh.write("x\n")
        if len(counter.read_text().splitlines()) <= fail_times:
            raise RuntimeError("injected write failure")
        inner(conn, rng, counts)

    return write


def test_failed_batch_is_planned_again_and_counted_once(counting: Counting, tmp_path: Path) -> None:
    topic, expected = counting.topic(2, 2_000)
    # 8 failures: more than Spark's 3 attempts of a task, so whole Spark jobs fail (BatchFailed)
    # and the runner plans again from the stored offsets
    writer = counting.writer(write=flaky_write(tmp_path / "calls", 8, counting.writer().write))
    summary = counting.run(topic, writer=writer, retries=5, retry_backoff_s=0.1)
    assert counting.totals() == dict(expected)
    assert summary.records == 2_000
    assert counting.offsets() == counting.ends(topic, 2)


def test_permanent_failure_stops_after_the_retries(counting: Counting, tmp_path: Path) -> None:
    topic, _ = counting.topic(1, 100)
    writer = counting.writer(write=flaky_write(tmp_path / "calls", 10**6, counting.writer().write))
    with pytest.raises(BatchFailed, match="injected write failure"):
        counting.run(topic, writer=writer, retries=1, retry_backoff_s=0.1)
    assert counting.totals() == {}
    assert counting.offsets() == {(topic, 0): 0}
