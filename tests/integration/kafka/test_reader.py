"""The exact range reader against the real broker: every field of a Record, gaps from transaction
markers, aborted records, marker-only ranges, ranges ending at the partition's end, compaction,
out-of-range starts and a dead broker."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import KafkaReadError
from txn_offsets.kafka.clients import LOGGER_NAME
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.kafka.reader import read_range
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange

# explicit record timestamps, recent ones: records older than the topic's retention (7 days) can be
# deleted by the broker at any time, and the test would read a log that starts later
BASE_MS = (int(time.time()) - 60) * 1000


def _tx_producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    return producer


def _tx(producer: Producer, topic: str, values: list[bytes], *, commit: bool) -> None:
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, value=v, partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)


def test_transactions_with_gaps(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = _tx_producer(kafka_bootstrap)
    _tx(producer, topic, [b"a0", b"a1", b"a2"], commit=True)  # 0-2, marker 3
    _tx(producer, topic, [b"x0", b"x1"], commit=False)  # 4-5 aborted, marker 6
    _tx(producer, topic, [b"b0"], commit=True)  # 7, marker 8
    end = settled_ends(kafka, topic, 1)[(topic, 0)]
    assert watermarks(kafka, [(topic, 0)])[(topic, 0)] == (0, end) == (0, 9)
    whole = list(read_range(kafka, OffsetRange(topic, 0, 0, end)))
    assert [(r.offset, r.value) for r in whole] == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (7, b"b0")]
    # ranges cut anywhere give the same records, each exactly once
    pieces = [OffsetRange(topic, 0, a, b) for a, b in [(0, 2), (2, 4), (4, 7), (7, 9)]]
    split = [r.offset for rng in pieces for r in read_range(kafka, rng)]
    assert split == [0, 1, 2, 7]
    # ranges holding only markers / aborted records end by position and yield nothing
    assert list(read_range(kafka, OffsetRange(topic, 0, 3, 7))) == []
    assert list(read_range(kafka, OffsetRange(topic, 0, 8, 9))) == []
    assert list(read_range(kafka, OffsetRange(topic, 0, 5, 5))) == []


def test_records_exactly_as_produced(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    """Every field of a Record: the range's topic and partition, offsets, keys (None when absent),
    values, timestamps (ms), headers as (str, bytes | None) tuples in order; markers skipped."""
    topic = topic_factory(partitions=2)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = _tx_producer(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, value=b"v0", partition=1, timestamp=BASE_MS + 0)
    producer.produce(topic, key=b"k1", value=b"v1", partition=1, timestamp=BASE_MS + 1)
    producer.produce(
        topic,
        key=b"k2",
        value=None,
        partition=1,
        timestamp=BASE_MS + 2,
        headers=[("h1", b"x"), ("h2", None), ("h1", b"y")],
    )
    producer.flush(30)
    producer.commit_transaction(30)  # offsets 0-2, marker 3
    producer.begin_transaction()
    producer.produce(topic, key=b"k4", value=b"gone", partition=1)
    producer.flush(30)
    producer.abort_transaction(30)  # 4 aborted, marker 5
    producer.begin_transaction()
    producer.produce(topic, key=b"", value=b"", partition=1, timestamp=BASE_MS + 6)
    producer.flush(30)
    producer.commit_transaction(30)  # 6, marker 7
    assert settled_ends(kafka, topic, 2) == {(topic, 0): 0, (topic, 1): 8}
    assert watermarks(kafka, [(topic, 1)])[(topic, 1)] == (0, 8)

    records = list(read_range(kafka, OffsetRange(topic, 1, 0, 8)))
    assert records == [
        Record(topic, 1, 0, None, b"v0", BASE_MS + 0, ()),
        Record(topic, 1, 1, b"k1", b"v1", BASE_MS + 1, ()),
        Record(topic, 1, 2, b"k2", None, BASE_MS + 2, (("h1", b"x"), ("h2", None), ("h1", b"y"))),
        Record(topic, 1, 6, b"", b"", BASE_MS + 6, ()),
    ]
    for rec in records:
        assert type(rec) is Record
        assert rec._fields == ("topic", "partition", "offset", "key", "value", "timestamp_ms", "headers")
        assert type(rec.topic) is str and type(rec.partition) is int and type(rec.offset) is int
        assert rec.key is None or type(rec.key) is bytes
        assert type(rec.headers) is tuple
    # the records pickle (they travel between Spark stages) and compare equal afterwards
    import pickle

    assert pickle.loads(pickle.dumps(records)) == records  # noqa: S301 - our own bytes
    # the other partition is empty: nothing, and no record of partition 1 leaks into it
    assert list(read_range(kafka, OffsetRange(topic, 0, 0, 0))) == []
    # any cut gives the same records once each, with the same fields
    cuts = [(0, 1), (1, 3), (3, 6), (6, 8)]
    assert [r for a, b in cuts for r in read_range(kafka, OffsetRange(topic, 1, a, b))] == records
    # reading fewer records per consume() call changes nothing
    assert list(read_range(kafka, OffsetRange(topic, 1, 0, 8), batch_size=1)) == records


def test_range_ending_at_the_partition_end_does_not_wait(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """A range whose tail holds fewer records than offsets (an aborted transaction and markers)
    and ends at the partition's end - every range of a caught-up job - ends as soon as the end is
    reached, not after a poll timeout spent waiting for records that cannot come."""
    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = _tx_producer(kafka_bootstrap)
    _tx(producer, topic, [f"a{i}".encode() for i in range(50)], commit=True)  # 0-49, marker 50
    _tx(producer, topic, [f"x{i}".encode() for i in range(30)], commit=False)  # 51-80, marker 81
    end = settled_ends(kafka, topic, 1)[(topic, 0)]
    assert end == 82
    assert len(list(read_range(kafka, OffsetRange(topic, 0, 0, end)))) == 50  # connect, warm the pool
    for start in (0, 40, 50, 51):
        t0 = time.monotonic()
        got = [r.offset for r in read_range(kafka, OffsetRange(topic, 0, start, end), poll_timeout_s=5.0)]
        elapsed = time.monotonic() - t0
        assert got == list(range(start, 50))
        assert elapsed < 2.5, f"range [{start}, {end}) took {elapsed:.2f}s: it waited out the poll timeout"


def test_open_transaction_bounds_the_lso(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = _tx_producer(kafka_bootstrap)
    _tx(producer, topic, [b"c0", b"c1"], commit=True)  # 0-1, marker 2
    assert settled_ends(kafka, topic, 1) == {(topic, 0): 3}
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    _, lso = watermarks(kafka, [(topic, 0)])[(topic, 0)]
    _, hwm = watermarks(KafkaSettings(kafka_bootstrap, isolation_level="read_uncommitted"), [(topic, 0)])[
        (topic, 0)
    ]
    assert (lso, hwm) == (3, 4)  # the planner never plans past the open transaction
    assert [r.value for r in read_range(kafka, OffsetRange(topic, 0, 0, lso))] == [b"c0", b"c1"]
    producer.flush(30)
    producer.abort_transaction(30)


def test_compacted_topic(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(
        partitions=1,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
            "min.compaction.lag.ms": "0",
        },
    )
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for round_ in range(20):
        for key in range(5):
            producer.produce(topic, key=f"k{key}".encode(), value=f"{round_}".encode())
        producer.flush(30)
        time.sleep(0.15)  # roll segments so the cleaner has something to compact
    end = settled_ends(kafka, topic, 1)[(topic, 0)]
    assert end == 100
    deadline = time.monotonic() + 60
    records = list(read_range(kafka, OffsetRange(topic, 0, 0, end)))
    while len(records) == 100 and time.monotonic() < deadline:
        time.sleep(2)
        records = list(read_range(kafka, OffsetRange(topic, 0, 0, end)))
    assert len(records) < 100, "the cleaner never compacted the topic"
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets)
    assert all(0 <= o < end for o in offsets)
    latest = {r.key: r.value for r in records}
    assert latest == {f"k{k}".encode(): b"19" for k in range(5)}


def test_deleted_start_is_an_error_not_a_jump(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    from confluent_kafka import TopicPartition

    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        producer.produce(topic, value=str(i).encode(), partition=0)
    producer.flush(30)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
        fut.result(30)
    with pytest.raises(KafkaReadError, match=r"offset 0 is no longer in the log"):
        list(read_range(kafka, OffsetRange(topic, 0, 0, 10), stall_timeout_s=20))
    assert [r.offset for r in read_range(kafka, OffsetRange(topic, 0, 5, 10))] == [5, 6, 7, 8, 9]


def test_unreachable_broker_stalls_into_a_clear_error() -> None:
    """... naming librdkafka's cause (issue 44: its own lines are INFO now, the error says it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    kafka = KafkaSettings(closed, {"socket.connection.setup.timeout.ms": 1000})
    t0 = time.monotonic()
    with pytest.raises(KafkaReadError, match="no progress for 3s") as stalled:
        list(read_range(kafka, OffsetRange("nowhere", 0, 0, 10), stall_timeout_s=3, poll_timeout_s=0.5))
    assert time.monotonic() - t0 < 30
    assert f"(connection refused by {closed} (nothing listens there))" in str(stalled.value)


def test_a_consumer_that_fetched_ahead_is_not_held_back_for_its_next_range(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer fetches ahead of its range until queued.min.messages are queued, then librdkafka
    postpones the partition's next fetch by fetch.queue.backoff.ms (its default 1,000 ms): the
    pooled consumer's next range on that partition waited it out (~1.1 s batches in the bench).
    Ours is 10 ms. librdkafka's fetch debug lines say each postponement and its length; the
    threshold is lowered here so that a few thousand records reach it."""
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for i in range(3_000):
        producer.produce(topic, key=b"k", value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    extra = {"debug": "fetch", "queued.min.messages": 100, "client.id": f"ahead-{uuid.uuid4().hex[:8]}"}
    kafka = KafkaSettings(kafka_bootstrap, extra=extra)
    for start in range(0, 1_000, 100):
        assert [r.offset for r in read_range(kafka, OffsetRange(topic, 0, start, start + 100))] == list(
            range(start, start + 100)
        )
    postponed = [
        int(m.group(1))
        for r in caplog.records
        if r.name == LOGGER_NAME
        and (m := re.search(r"Fetch backoff for (\d+)ms: Local: Queue full", r.getMessage()))
    ]
    assert postponed, "the consumer never fetched ahead past queued.min.messages: the test proves nothing"
    assert max(postponed) <= 10
