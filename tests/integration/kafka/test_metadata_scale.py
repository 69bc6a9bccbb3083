"""The planner's Kafka facts at scale: offsets asked in chunks of LIST_OFFSETS_CHUNK partitions
(one future per chunk) equal the public per-partition AdminClient.list_offsets answers, and the
topics are described while the partitions seen before are asked for, partitions added since then
included."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import IsolationLevel, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewPartitions, OffsetSpec

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.commit.proof import check_incarnation
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import TopicChanged
from txn_offsets.kafka import metadata
from txn_offsets.ranges import OffsetRange


def _public(admin: AdminClient, topic: str, parts: int) -> dict[tuple[str, int], tuple[int, int]]:
    """(log start, end) per partition through the public API, a future per partition."""
    out = {}
    for spec_index, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        futures = admin.list_offsets(
            {KafkaTP(topic, p): spec for p in range(parts)},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=30,
        )
        for tp, fut in futures.items():
            low, high = out.get((tp.topic, tp.partition), (0, 0))
            offset = fut.result(30).offset
            out[(tp.topic, tp.partition)] = (offset, high) if spec_index == 0 else (low, offset)
    return out


def _until_led(kafka: KafkaSettings, topic: str, parts: int) -> None:
    """A new topic's partitions answer once each has a leader (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            metadata.watermarks(kafka, [(topic, p) for p in range(parts)], timeout_s=10)
            return
        except Exception:
            assert time.monotonic() < deadline, "the topic's partitions got no leader"
            time.sleep(0.5)


def test_chunked_offsets_equal_the_per_partition_answers(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    parts = 2 * metadata.LIST_OFFSETS_CHUNK + 7  # three chunks, the last one short
    topic = topic_factory(partitions=parts)
    kafka = KafkaSettings(kafka_bootstrap)
    _until_led(kafka, topic, parts)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    counts = {0: 3, metadata.LIST_OFFSETS_CHUNK: 5, parts - 1: 2}
    for part, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=b"v%d" % i, partition=part)
    assert producer.flush(30) == 0
    settled_ends(kafka, topic, counts)
    marks = metadata.watermarks(kafka, [(topic, p) for p in range(parts)], timeout_s=30)
    assert marks == _public(kafka_admin, topic, parts)
    assert {p: marks[(topic, p)][1] for p in counts} == counts
    assert sum(end for _, end in marks.values()) == 10


def test_topics_and_watermarks_follow_added_partitions(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=2)
    kafka = KafkaSettings(kafka_bootstrap)
    _until_led(kafka, topic, 2)
    infos, marks = metadata.topics_and_watermarks(kafka, [topic], timeout_s=30)
    assert infos[topic].partitions == (0, 1) and set(marks) == {(topic, 0), (topic, 1)}
    kafka_admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    _until_led(kafka, topic, 3)
    again, marks = metadata.topics_and_watermarks(kafka, [topic], timeout_s=30)
    assert again[topic].partitions == (0, 1, 2) and again[topic].topic_id == infos[topic].topic_id
    assert marks == {(topic, p): (0, 0) for p in range(3)}


def test_the_incarnation_check_holds_every_range_to_its_own_planned_id(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """check_incarnation over the ranges of several plans (a shared round's jobs, checked in one
    request): a range planned from an older incarnation fails the check even when another range of
    the same topic, listed first, carries the current id."""
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=2)
    current = metadata.describe_topics(kafka, [topic], timeout_s=30)[topic].topic_id
    fresh = OffsetRange(topic, 0, 0, 1, topic_id=current)
    stale = OffsetRange(topic, 1, 0, 1, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    check_incarnation(kafka, [fresh], timeout_s=30)  # the same incarnation: passes
    with pytest.raises(TopicChanged) as caught:
        check_incarnation(kafka, [fresh, stale], timeout_s=30)
    assert caught.value.topic == topic and current in str(caught.value)


def test_offsets_asked_straight_after_the_topic_is_created_wait_for_its_leaders(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Right after create_topics the broker's metadata names each partition's leader a moment before
    that broker answers ListOffsets as its leader (NOT_LEADER_FOR_PARTITION): 36 of 40 such asks
    failed as "cannot reach Kafka" before the offsets were asked again; none may fail now (ten
    topics of four partitions, each asked at once, watermarks and a plan's topics-and-offsets)."""
    kafka = KafkaSettings(kafka_bootstrap)
    for _ in range(5):
        topic = topic_factory(partitions=4)
        assert metadata.watermarks(kafka, [(topic, p) for p in range(4)], timeout_s=10) == {
            (topic, p): (0, 0) for p in range(4)
        }
    for _ in range(5):
        topic = topic_factory(partitions=4)
        infos, marks = metadata.topics_and_watermarks(kafka, [topic], timeout_s=10)
        assert infos[topic].partitions == (0, 1, 2, 3)
        assert marks == {(topic, p): (0, 0) for p in range(4)}
