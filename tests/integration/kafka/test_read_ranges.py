"""Many small ranges read together (reader.read_ranges, one assignment) against the real broker:
the same records as reading each range alone, marker-only and empty ranges, errors as read_range."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, KafkaReadError
from txn_offsets.kafka import fetcher
from txn_offsets.kafka.consumers import pool
from txn_offsets.kafka.reader import PAUSE_MIN_LEFT, read_range, read_ranges
from txn_offsets.ranges import OffsetRange


@pytest.fixture(autouse=True)
def librdkafka_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the librdkafka read: Kafka's own Fetch (kafka.fetcher, tested in
    test_fetcher.py) leaves every range to it."""
    monkeypatch.setattr(fetcher, "read_wide", lambda _kafka, ranges: ({}, list(ranges)))


def test_ranges_read_together_are_the_ranges_read_alone(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=4)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    for commit in (
        True,
        False,
        True,
    ):  # per partition: 0-4, marker 5; 6-10 aborted, marker 11; 12-16, marker 17
        producer.begin_transaction()
        for part in range(3):
            for i in range(5):
                producer.produce(topic, key=f"k{i}".encode(), value=f"p{part}-{i}".encode(), partition=part)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    ends = settled_ends(kafka, topic, 4)
    assert ends == {(topic, 0): 18, (topic, 1): 18, (topic, 2): 18, (topic, 3): 0}
    cuts = [
        [OffsetRange(topic, 0, 0, 18), OffsetRange(topic, 1, 0, 18), OffsetRange(topic, 2, 0, 18)],
        [
            OffsetRange(topic, 0, 3, 13),
            OffsetRange(topic, 1, 5, 12),
            OffsetRange(topic, 3, 0, 0),
        ],  # 1: markers
        [OffsetRange(topic, 2, 14, 18), OffsetRange(topic, 0, 17, 18), OffsetRange(topic, 1, 0, 1)],
    ]
    for ranges in cuts:
        together = read_ranges(kafka, ranges, batch_size=7)
        assert together == {r.key: list(read_range(kafka, r)) for r in ranges}
    first = read_ranges(kafka, cuts[0])
    assert [r.offset for r in first[(topic, 1)]] == [0, 1, 2, 3, 4, 12, 13, 14, 15, 16]
    assert {r.value for r in first[(topic, 2)]} >= {b"p2-0", b"p2-4"}
    assert read_ranges(kafka, cuts[1])[(topic, 1)] == [] and read_ranges(kafka, cuts[1])[(topic, 3)] == []


def test_one_range_per_partition(kafka_bootstrap: str) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    with pytest.raises(ConfigError, match="one range per partition"):
        read_ranges(kafka, [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 9)])


def test_a_deleted_start_is_an_error_naming_its_range(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=2)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for part in range(2):
        for i in range(10):
            producer.produce(topic, value=str(i).encode(), partition=part)
    producer.flush(30)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 1, 5)]).values():
        fut.result(30)
    ranges = [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 10)]
    with pytest.raises(KafkaReadError, match=r"offset 0 is no longer in the log") as info:
        read_ranges(kafka, ranges, stall_timeout_s=20)
    assert f"{topic}[1]" in str(info.value)
    ok = read_ranges(kafka, [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 5, 10)])
    assert [len(v) for v in ok.values()] == [10, 5]


def test_an_unreachable_broker_stalls_into_a_clear_error() -> None:
    kafka = KafkaSettings("127.0.0.1:1", {"socket.connection.setup.timeout.ms": 1000})
    t0 = time.monotonic()
    with pytest.raises(KafkaReadError, match="no progress for 3s"):
        read_ranges(
            kafka,
            [OffsetRange("nowhere", 0, 0, 10), OffsetRange("nowhere", 1, 0, 10)],
            stall_timeout_s=3,
            poll_timeout_s=0.5,
        )
    assert time.monotonic() - t0 < 30


def test_a_record_larger_than_a_small_reads_fetch_is_read_whole(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """read_ranges' consumers fetch 256 kB per partition (SMALL_READS: a small range no longer
    drags thousands of records past its end through the broker and Python); a record larger than
    that still comes whole (the broker returns a partition's first batch entire), between small
    ones, in both readers."""
    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    big = bytes(range(256)) * 2_400  # 614,400 bytes: over twice the fetch size
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    for value in (b"a", big, b"b", big, b"c"):
        producer.produce(topic, value=value, partition=0)
        producer.flush(30)
    settled_ends(kafka, topic, 1)
    rng = OffsetRange(topic, 0, 0, 5)
    assert [r.value for r in read_range(kafka, rng)] == [b"a", big, b"b", big, b"c"]
    (got,) = read_ranges(kafka, [OffsetRange(topic, 0, 1, 4)]).values()
    assert [r.value for r in got] == [big, b"b", big]


def test_small_reads_fetch_less_unless_the_user_says_otherwise() -> None:
    from txn_offsets.kafka.consumers import consumer_config

    small = consumer_config(KafkaSettings("127.0.0.1:1"), small=True)
    assert (small["max.partition.fetch.bytes"], small["queued.min.messages"]) == (262_144, 2_000)
    streaming = consumer_config(KafkaSettings("127.0.0.1:1"))
    assert "max.partition.fetch.bytes" not in streaming and "queued.min.messages" not in streaming
    mine = KafkaSettings("127.0.0.1:1", extra={"max.partition.fetch.bytes": "1048576"})
    assert consumer_config(mine, small=True)["max.partition.fetch.bytes"] == "1048576"


class _JustAssigned:
    """A pooled consumer as librdkafka can answer right after assign(), before it has taken the new
    assignment in (seen on the stack in 9 of 50 reassigns of a partition a pooled consumer had read
    to its end): the first consume() calls find nothing yet, and position() answers where the
    previous read of each partition ended until the partition has delivered something of its new
    assignment. The real consumer underneath does the reading."""

    def __init__(self, real: Any, previous: dict[tuple[str, int], int]) -> None:
        self._real, self._previous = real, previous
        self._stale: set[tuple[str, int]] = set()
        self._empty_polls = 0

    def assign(self, parts: list[TopicPartition]) -> None:
        self._real.assign(parts)
        self._stale = {(tp.topic, tp.partition) for tp in parts}
        self._empty_polls = 2

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if self._empty_polls:
            self._empty_polls -= 1
            return []
        messages: list[Any] = self._real.consume(num_messages, timeout)
        self._stale -= {(m.topic(), m.partition()) for m in messages}
        return messages

    def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self._previous[(tp.topic, tp.partition)])
            if (tp.topic, tp.partition) in self._stale
            else tp
            for tp in self._real.position(parts)
        ]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_position_from_before_the_assignment_ends_no_range_early(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Found while chasing a scale-bench shortfall (which turned out to be the producer's): right
    after assign(), a pooled consumer's position() answered its previous read of the partition in 9
    of 50 reassigns on the stack. Trusted, a position ahead of the new range's end ended the range
    with none of its records read - and its claim would have committed it. The reader only uses a
    partition's position() once the partition delivered a record or an event of its new
    assignment (or had no position yet)."""
    parts = 8
    topic = topic_factory(partitions=parts)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for i in range(parts * 30):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % parts)
    assert producer.flush(30) == 0
    ends = settled_ends(kafka, topic, parts)
    assert set(ends.values()) == {30}
    for small in (True, False):  # the pools of read_ranges and of read_range
        noted = _JustAssigned(pool.take(kafka, (topic,), small=small), ends)
        pool.give_back(kafka, noted, assigned=0, small=small)
    try:
        together = read_ranges(kafka, [OffsetRange(topic, p, 3, 13) for p in range(parts)])
        assert {tp: [r.offset for r in rs] for tp, rs in together.items()} == {
            (topic, p): list(range(3, 13)) for p in range(parts)
        }
        alone = list(read_range(kafka, OffsetRange(topic, 5, 3, 13)))
        assert [r.offset for r in alone] == list(range(3, 13))
    finally:
        for small in (True, False):
            pool.discard(pool.take(kafka, (), small=small))


class _Pauses:
    """A pooled consumer that notes the partitions paused; the real consumer does the reading."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.paused: list[tuple[str, int]] = []

    def pause(self, parts: list[TopicPartition]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in parts]
        self._real.pause(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_complete_range_is_paused_only_when_much_of_its_log_is_left(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """A pause is one librdkafka op per partition, answered by its broker thread (2,048 of them
    took ~1 s of a read of 2,048 small ranges under load): a partition whose log holds at most
    PAUSE_MIN_LEFT offsets past its range is left to deliver them (skipped), one with more is
    paused. The records read are the same either way."""
    topic = topic_factory(partitions=2)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    sizes = {0: 20, 1: 5 + PAUSE_MIN_LEFT + 400}  # past the ranges [0, 5): 15 offsets, and 500 over
    for part, n in sizes.items():
        for i in range(n):
            producer.produce(topic, value=f"p{part}-{i}".encode(), partition=part)
    assert producer.flush(30) == 0
    assert settled_ends(kafka, topic, 2) == {(topic, p): n for p, n in sizes.items()}
    noted = _Pauses(pool.take(kafka, (topic,), small=True))
    pool.give_back(kafka, noted, assigned=0, small=True)
    try:
        ranges = [OffsetRange(topic, 0, 0, 5), OffsetRange(topic, 1, 0, 5)]
        got = read_ranges(kafka, ranges)
        assert {tp: [r.value for r in rs] for tp, rs in got.items()} == {
            (topic, p): [f"p{p}-{i}".encode() for i in range(5)] for p in (0, 1)
        }
        assert noted.paused == [(topic, 1)]
    finally:
        pool.discard(pool.take(kafka, (), small=True))
