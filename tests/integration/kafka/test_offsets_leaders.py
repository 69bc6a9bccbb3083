"""The offsets client asks for offsets only once it knows the partitions' leaders
(txn_offsets.kafka.leaders): librdkafka then never has to look leaders up for a ListOffsets
request on its own, the lookup whose race with a cache update crashed the driver in CI.

librdkafka's debug log (``debug=metadata``) names each metadata request it makes for itself; the one
a ListOffsets makes for unknown leaders says "query partition leaders"."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.fix_services import TopicFactory
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import TopicMissing
from txn_offsets.kafka import admins, metadata
from txn_offsets.kafka.clients import LOGGER_NAME, serve_logs

LEADER_QUERY = "query partition leaders"


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


def _debugged(kafka: KafkaSettings) -> KafkaSettings:
    """Settings of a client of its own (a new client id) with librdkafka's metadata debug lines."""
    extra = {
        **kafka.extra,
        "client.id": f"leaders-{uuid.uuid4().hex[:8]}",
        "debug": "metadata",
        "log_level": 7,
    }
    return KafkaSettings(kafka.bootstrap_servers, extra=extra, isolation_level=kafka.isolation_level)


def _produce(kafka: KafkaSettings, topic: str, per_partition: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, key=b"k", value=str(i).encode(), partition=partition)
    assert producer.flush(30) == 0


def _leader_queries(caplog: pytest.LogCaptureFixture, settings: KafkaSettings) -> list[str]:
    """The offsets client's lookups of leaders it lacked, among its log lines so far."""
    serve_logs(admins.admin_client(settings, "offsets"))  # an AdminClient's lines wait for a poll
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER_NAME and LEADER_QUERY in r.getMessage()
    ]


def test_offsets_of_a_new_topic_are_asked_with_its_leaders_known(
    kafka: KafkaSettings, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    settings = _debugged(kafka)
    other = topic_factory(partitions=1)
    assert metadata.watermarks(settings, [(other, 0)]) == {(other, 0): (0, 0)}  # the client exists
    topic = topic_factory(partitions=2)
    _produce(kafka, topic, {0: 3, 1: 5})
    caplog.clear()
    # earliest and latest: two requests asked back to back, the crash's pattern
    assert metadata.watermarks(settings, [(topic, 0), (topic, 1)]) == {(topic, 0): (0, 3), (topic, 1): (0, 5)}
    assert metadata.offsets_for_time(settings, [(topic, 0), (topic, 1)], 0) == {(topic, 0): 0, (topic, 1): 0}
    assert _leader_queries(caplog, settings) == []


def test_partitions_added_are_looked_up_before_their_offsets_are_asked(
    kafka: KafkaSettings,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    settings = _debugged(kafka)
    topic = topic_factory(partitions=1)
    assert metadata.watermarks(settings, [(topic, 0)]) == {(topic, 0): (0, 0)}
    kafka_admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    _produce(kafka, topic, {2: 4})
    caplog.clear()
    marks = metadata.watermarks(settings, [(topic, p) for p in range(3)])
    assert marks == {(topic, 0): (0, 0), (topic, 1): (0, 0), (topic, 2): (0, 4)}
    assert _leader_queries(caplog, settings) == []


def test_a_missing_topic_or_partition_is_named_and_never_created(
    kafka: KafkaSettings, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    settings = _debugged(kafka)
    missing = f"never-created-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TopicMissing) as info:
        metadata.watermarks(settings, [(missing, 0)])
    assert info.value.topic == missing and f"topic {missing!r} does not exist" in str(info.value)
    assert missing not in kafka_admin.list_topics(timeout=10).topics
    topic = topic_factory(partitions=2)
    with pytest.raises(TopicMissing) as info:
        metadata.watermarks(settings, [(topic, 0), (topic, 2)])
    assert f"{topic}[2] does not exist" in str(info.value)


def test_several_new_topics_are_looked_up_in_one_request(
    kafka: KafkaSettings, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    settings = _debugged(kafka)
    topics = [topic_factory(partitions=2) for _ in range(5)]
    for i, topic in enumerate(topics):
        _produce(kafka, topic, {0: i, 1: 1})
    caplog.clear()
    marks = metadata.watermarks(settings, [(t, p) for t in topics for p in range(2)])
    assert marks == {(t, p): (0, i if p == 0 else 1) for i, t in enumerate(topics) for p in range(2)}
    assert _leader_queries(caplog, settings) == []
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    asked = [line for line in lines if "application requested" in line and "Request metadata" in line]
    assert len(asked) == 1 and "for all topics" in asked[0]  # one request for the five, not five
