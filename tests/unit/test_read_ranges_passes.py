"""read_ranges' work per pass follows what it was handed (txn_offsets.kafka.reader): records of
ranges already complete (prefetched past their ends) arrive pass after pass while the open ranges
wait for theirs, and position() of every open partition is then asked at most once per
POSITION_AFTER_S - it used to be asked on every such pass (2,048 partitions: ~50 ms each under
load). Driven by a scripted consumer; the reads of a real broker are tests/integration/kafka."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import fetcher, reader
from txn_offsets.ranges import OffsetRange

TOPIC = "t"


class _Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def headers(self) -> None:
        return None


class _Consumer:
    """Partition 0's range ends at once; then `idle_passes` passes hand out only records past it
    (1 ms apart); then the other partitions' records."""

    def __init__(self, others: int, idle_passes: int) -> None:
        self.script: Iterator[list[_Message]] = iter(
            [
                [_Message(0, 0)],
                *([_Message(0, 1 + i)] for i in range(idle_passes)),
                [_Message(p, 0) for p in range(1, others + 1)],
            ]
        )
        self.asked: list[int] = []  # partitions asked per position() call

    def assign(self, parts: list[TopicPartition]) -> None:
        pass

    def consume(self, num: int, timeout: float) -> list[_Message]:
        time.sleep(0.001)
        return next(self.script, [])

    def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        self.asked.append(len(parts))
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in parts]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return (0, 10)


class _Pool:
    def __init__(self, consumer: _Consumer) -> None:
        self.consumer = consumer

    def take(self, *args: Any, **kwargs: Any) -> _Consumer:
        return self.consumer

    def give_back(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def librdkafka_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the librdkafka read: Kafka's own Fetch (kafka.fetcher, tested in
    test_fetcher.py) leaves every range to it."""
    monkeypatch.setattr(fetcher, "read_wide", lambda _kafka, ranges: ({}, list(ranges)))


def test_positions_of_open_ranges_are_asked_at_most_once_per_quiet_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    others, idle_passes = 50, 300
    consumer = _Consumer(others, idle_passes)
    monkeypatch.setattr(reader, "pool", _Pool(consumer))
    ranges = [OffsetRange(TOPIC, p, 0, 1) for p in range(others + 1)]
    t0 = time.monotonic()
    got = reader.read_ranges(KafkaSettings("localhost:9"), ranges)
    elapsed = time.monotonic() - t0
    # every range's one record, in place
    assert {k: [r.offset for r in v] for k, v in got.items()} == {(TOPIC, p): [0] for p in range(others + 1)}
    # the idle passes asked every open partition's position once per POSITION_AFTER_S, not each
    assert all(n == others for n in consumer.asked)
    assert len(consumer.asked) <= elapsed / reader.POSITION_AFTER_S + 2
    assert len(consumer.asked) < idle_passes / 4
