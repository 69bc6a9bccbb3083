"""How a Spark task reads its ranges (reader.read_in_order) against the real broker: a commit task
(PartitionTask) and a records task (ReadTask: BatchWriter's records, the Structured Streaming
adapter's source) read the same way - small ranges together in one Fetch, a range too large to go
with the next one streamed on its own - and yield exactly what reading each range alone yields, in
the order given."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import reader
from txn_offsets.kafka.consumers import pool
from txn_offsets.kafka.reader import read_in_order, read_range
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import ReadTask


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[OffsetRange]:
    """The ranges read_in_order streamed on their own (read_range), in order: the real reader runs."""
    seen: list[OffsetRange] = []
    real = reader.read_range

    def spy(kafka: KafkaSettings, rng: OffsetRange, **kwargs: Any) -> Iterator[Record]:
        seen.append(rng)
        return real(kafka, rng, **kwargs)

    monkeypatch.setattr(reader, "read_range", spy)
    return seen


@pytest.fixture
def assignments(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The librdkafka consumers taken (one per range streamed alone, one for what a Fetch left)."""
    taken: list[tuple[str, ...]] = []
    real = pool.take

    def spy(kafka: KafkaSettings, topics: tuple[str, ...] = (), **kwargs: Any) -> Any:
        taken.append(tuple(topics))
        return real(kafka, topics, **kwargs)

    monkeypatch.setattr(pool, "take", spy)
    return taken


def _topic(kafka_bootstrap: str, topic_factory: TopicFactory) -> str:
    topic = topic_factory(partitions=4)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for part in range(4):
        for i in range(30):
            producer.produce(topic, key=f"k{i}".encode(), value=f"p{part}-{i}".encode(), partition=part)
    producer.flush(30)
    assert settled_ends(KafkaSettings(kafka_bootstrap), topic, 4) == {(topic, p): 30 for p in range(4)}
    return topic


def test_a_records_task_reads_its_small_ranges_in_one_go(
    kafka_bootstrap: str, topic_factory: TopicFactory, assignments: list[tuple[str, ...]]
) -> None:
    topic = _topic(kafka_bootstrap, topic_factory)
    kafka = KafkaSettings(kafka_bootstrap)
    ranges = (
        OffsetRange(topic, 2, 5, 17),
        OffsetRange(topic, 0, 0, 30),
        OffsetRange(topic, 3, 29, 30),
        OffsetRange(topic, 1, 10, 10),  # empty
    )
    alone = [rec for rng in ranges for rec in read_range(kafka, rng)]
    assert len(assignments) == 3  # read alone: a consumer for each range with offsets
    assignments.clear()
    task = ReadTask(kafka, ranges)
    got = list(task(0, [(0, 1, 2, 3)]))
    assert got == alone
    assert [(r.partition, r.offset) for r in got[:2]] == [(2, 5), (2, 6)]
    assert len(got) == 12 + 30 + 1
    assert assignments == []  # one Fetch for all four: no consumer assigned per range
    # the group a task was given, in its order: a second task of the same batch
    assert list(task(1, [(2, 0)])) == [*read_range(kafka, ranges[2]), *read_range(kafka, ranges[0])]


def test_a_range_too_large_to_go_with_the_next_is_streamed_on_its_own(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    streamed: list[OffsetRange],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = _topic(kafka_bootstrap, topic_factory)
    kafka = KafkaSettings(kafka_bootstrap)
    monkeypatch.setattr(reader, "TOGETHER_MAX_OFFSETS", 20)
    ranges = [
        OffsetRange(topic, 0, 0, 25),  # alone over the limit: streamed
        OffsetRange(topic, 1, 0, 8),  # these two fit together (18 offsets)
        OffsetRange(topic, 2, 0, 10),
        OffsetRange(topic, 3, 0, 30),  # streamed
    ]
    alone = {rng: list(read_range(kafka, rng)) for rng in ranges}
    streamed.clear()
    read = [(rng, list(records)) for rng, records in read_in_order(kafka, ranges, batch_size=7)]
    assert read == [(rng, alone[rng]) for rng in ranges]
    assert streamed == [ranges[0], ranges[3]]
    assert [len(records) for _, records in read] == [25, 8, 10, 30]
