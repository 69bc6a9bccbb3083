"""The range readers' consumer pool (txn_offsets.kafka.consumers) against the real broker: a pooled
consumer gets the metadata of a topic new to it before the topic is assigned, once per topic.

Without it librdkafka looks the topic up by itself, rate-limited: the first record of a range on
the third and later new topics of one consumer came after ~1 s instead of a few ms (many jobs in
one application, a topic each, spent most of their time there). A pooled consumer is retired after
RETIRE_AFTER_ASSIGNMENTS partition assignments (librdkafka's consumer slows with each)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import consumers, fetcher
from txn_offsets.kafka.consumers import ConsumerPool, pool
from txn_offsets.kafka.reader import read_range, read_ranges
from txn_offsets.ranges import OffsetRange


def _produce(bootstrap: str, topics: list[str], per_topic: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic in topics:
        for i in range(per_topic):
            producer.produce(topic, value=f"{topic}-{i}".encode(), partition=0)
    assert producer.flush(30) == 0


@pytest.fixture(autouse=True)
def librdkafka_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the librdkafka read: Kafka's own Fetch (kafka.fetcher, tested in
    test_fetcher.py) leaves every range to it."""
    monkeypatch.setattr(fetcher, "read_wide", lambda _kafka, ranges: ({}, list(ranges)))


def test_take_fetches_metadata_of_new_topics_only(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topics = [topic_factory(partitions=1) for _ in range(3)]
    mine = ConsumerPool()
    consumer = mine.take(kafka, topics[:2])
    try:
        assert mine.known_topics(consumer) == frozenset(topics[:2])
        mine.give_back(kafka, consumer, assigned=0)
        again = mine.take(kafka, topics)  # the same consumer, one more topic
        assert again is consumer
        assert mine.known_topics(again) == frozenset(topics)
        # a topic that does not exist is not remembered (asked again next time) and raises nothing
        missing = f"{topics[0]}-missing"
        assert missing not in mine.take(kafka, [missing]).list_topics(timeout=10).topics
        assert mine.known_topics(again) == frozenset(topics)
        mine.give_back(kafka, again, assigned=0)
    finally:
        mine.close_all()
    assert mine.known_topics(consumer) == frozenset()  # forgotten once closed


def test_first_records_of_many_new_topics_come_without_the_lookup_wait(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """One pooled consumer reads a range of each of 5 fresh topics in turn: every range is exact,
    and none waits for librdkafka's own (rate-limited) topic lookup: before the pool fetched the
    metadata up front, the third and later topics' first records took ~1,000 ms each; now a few ms
    (the bound below is half the old wait, for a loaded CI machine; the first read, which also
    connects the consumer, is not bounded)."""
    kafka = KafkaSettings(kafka_bootstrap)
    topics = [topic_factory(partitions=1) for _ in range(5)]
    _produce(kafka_bootstrap, topics, per_topic=4)
    firsts: list[float] = []
    for topic in topics:
        t0 = time.perf_counter()
        reader = read_range(kafka, OffsetRange(topic, 0, 0, 4))
        first = next(reader)
        firsts.append(time.perf_counter() - t0)
        rest = list(reader)
        assert [r.value for r in [first, *rest]] == [f"{topic}-{i}".encode() for i in range(4)]
    assert max(firsts[1:]) < 0.5, [round(f * 1000) for f in firsts]
    idle = pool.take(kafka)
    try:
        assert set(topics) <= pool.known_topics(idle)
    finally:
        pool.give_back(kafka, idle, assigned=0)


def _closed(consumer: Any) -> bool:
    try:
        consumer.assignment()
    except RuntimeError:  # "Consumer closed"
        return True
    return False


def test_a_consumer_is_retired_after_its_share_of_partition_assignments(
    kafka_bootstrap: str, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each assign()/unassign() of many partitions leaves librdkafka's consumer slower for good (a
    reader of 2 x 2,048 small ranges a batch: 0.29 s, then 1.73 s by the eighth batch): the pool
    closes a consumer that served RETIRE_AFTER_ASSIGNMENTS partition assignments instead of
    pooling it again (closed in a thread of its own). Here the bound is 20: after two reads of 8
    partitions the consumer is pooled again, after the third (24 served) it is closed; every read
    exact."""
    monkeypatch.setattr(consumers, "RETIRE_AFTER_ASSIGNMENTS", 20)
    parts = 8
    topic = topic_factory(partitions=parts)
    kafka = KafkaSettings(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for i in range(parts * 3):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % parts)
    assert producer.flush(30) == 0
    pool.discard(pool.take(kafka, (), small=True))  # no consumer with assignments served before
    seen: list[object] = []
    for start in range(3):
        got = read_ranges(kafka, [OffsetRange(topic, p, start, start + 1) for p in range(parts)])
        assert {tp: [r.value for r in rs] for tp, rs in got.items()} == {
            (topic, p): [f"v{start * parts + p}".encode()] for p in range(parts)
        }
        idle = pool.take(kafka, (), small=True)
        seen.append(idle)
        pool.give_back(kafka, idle, assigned=0, small=True)
    assert seen[0] is seen[1] and seen[2] is not seen[1]  # 8, 16, then 24 served: closed, a new one
    # a pool's own count: one short of the bound pools the consumer again, the bound closes it
    mine = ConsumerPool()
    try:
        first = mine.take(kafka)
        mine.give_back(kafka, first, assigned=19)
        assert mine.take(kafka) is first
        mine.give_back(kafka, first, assigned=1)
        second = mine.take(kafka)
        assert second is not first
        mine.give_back(kafka, second, assigned=0)
        deadline = time.monotonic() + 30  # the retired one is closed in a thread of its own
        while not _closed(first):
            assert time.monotonic() < deadline, "the retired consumer was never closed"
            time.sleep(0.05)
    finally:
        mine.close_all()
