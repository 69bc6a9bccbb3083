"""The range readers' consumer pool (txn_offsets.kafka.consumers) against the real broker: a pooled
consumer gets the metadata of a topic new to it before the topic is assigned, once per topic.

Without it librdkafka looks the topic up by itself, rate-limited: the first record of a range on
the third and later new topics of one consumer came after ~1 s instead of a few ms (many jobs in
one application, a topic each, spent most of their time there)."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from txn_offsets.config import KafkaSettings
from txn_offsets.kafka.consumers import ConsumerPool, pool
from txn_offsets.kafka.reader import read_range
from txn_offsets.ranges import OffsetRange


def _produce(bootstrap: str, topics: list[str], per_topic: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic in topics:
        for i in range(per_topic):
            producer.produce(topic, value=f"{topic}-{i}".encode(), partition=0)
    assert producer.flush(30) == 0


def test_take_fetches_metadata_of_new_topics_only(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topics = [topic_factory(partitions=1) for _ in range(3)]
    mine = ConsumerPool()
    consumer = mine.take(kafka, topics[:2])
    try:
        assert mine.known_topics(consumer) == frozenset(topics[:2])
        mine.give_back(kafka, consumer)
        again = mine.take(kafka, topics)  # the same consumer, one more topic
        assert again is consumer
        assert mine.known_topics(again) == frozenset(topics)
        # a topic that does not exist is not remembered (asked again next time) and raises nothing
        missing = f"{topics[0]}-missing"
        assert missing not in mine.take(kafka, [missing]).list_topics(timeout=10).topics
        assert mine.known_topics(again) == frozenset(topics)
        mine.give_back(kafka, again)
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
        pool.give_back(kafka, idle)
