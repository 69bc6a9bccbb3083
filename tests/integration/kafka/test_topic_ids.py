"""The commit's proof asks each broker for a topic's id; for a topic of many partitions it asks for
the id alone (DescribeTopicPartitions with a limit of one partition), not a Metadata answer that
lists every partition (at 4,096 partitions ~14 ms of the broker's CPU and ~8 ms of the worker's to
read, in every commit). Against the real broker: the same ids, the same refusal of a re-created
topic, and Metadata still asked of a broker that does not serve DescribeTopicPartitions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.kafka_topics import recreate_topic
from txn_offsets.commit.proof import check_incarnation
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import TopicChanged, TopicMissing
from txn_offsets.kafka import direct, metadata, recreated
from txn_offsets.ranges import OffsetRange

WIDE = recreated.WIDE_PARTITIONS + 72  # 200
UNKNOWN_TOPIC_OR_PARTITION = 3


def _connection(kafka_bootstrap: str) -> direct.Connection:
    host, _, port = kafka_bootstrap.split(",", maxsplit=1)[0].rpartition(":")
    return direct.connect({}, host, int(port), 10.0)


@pytest.fixture
def reach(kafka_bootstrap: str) -> Iterator[recreated.Brokers]:
    """Connections to the brokers of their own (not this process's kept ones), closed after the test."""
    brokers = recreated.Brokers(KafkaSettings(kafka_bootstrap))
    yield brokers
    for conn in brokers.conns.values():
        conn.close()


def test_a_wide_topic_is_asked_for_its_id_alone_after_the_first_answer(
    kafka_bootstrap: str, topic_factory: TopicFactory, reach: recreated.Brokers
) -> None:
    topic, narrow = topic_factory(partitions=WIDE), topic_factory(partitions=8)
    first = reach.views([topic, narrow], 10.0)
    (broker,) = first
    assert _seen(first[broker][topic]).leaders.keys() == set(range(WIDE))  # Metadata, the first time
    assert reach.wide == {topic}
    later = reach.views([topic, narrow], 10.0)[broker]
    planned = metadata.describe_topics(KafkaSettings(kafka_bootstrap), [topic, narrow])
    assert _seen(later[topic]).topic_id == planned[topic].topic_id
    assert _seen(later[topic]).leaders == {}  # its id alone: no partition was listed
    assert _seen(later[narrow]).topic_id == planned[narrow].topic_id
    assert len(_seen(later[narrow]).leaders) == 8  # a topic of few partitions: Metadata, cheaper for it


def _seen(view: recreated.View | None) -> recreated.View:
    assert view is not None, "the broker did not answer"
    return view


def test_the_ids_answer_names_what_metadata_names(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic, missing = topic_factory(partitions=WIDE), "no-such-topic-ids-answer"
    with _connection(kafka_bootstrap) as conn:
        full = direct.metadata(conn, [topic, missing])
        assert direct.supports(conn, direct.DESCRIBE_TOPIC_PARTITIONS, 0)  # Kafka 4.1 with KRaft
        ids = direct.topic_ids_answer(
            conn, direct.send_topic_ids(conn, [topic, missing], wide={topic, missing})
        )
    assert ids.brokers == full.brokers
    assert (ids.topics[topic].error, ids.topics[topic].topic_id) == (0, full.topics[topic].topic_id)
    assert ids.topics[topic].partitions == {}
    assert full.topics[missing].error == UNKNOWN_TOPIC_OR_PARTITION
    assert ids.topics[missing].error == UNKNOWN_TOPIC_OR_PARTITION


def test_a_broker_without_describe_topic_partitions_is_asked_metadata(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=WIDE)
    with _connection(kafka_bootstrap) as conn:
        conn.apis = {direct.METADATA: (0, 13)}  # what a broker older than Kafka 3.7 (or ZooKeeper's) serves
        ids = direct.topic_ids_answer(conn, direct.send_topic_ids(conn, [topic], wide={topic}))
        full = direct.metadata(conn, [topic])
    assert ids.topics[topic].topic_id == full.topics[topic].topic_id
    assert len(ids.topics[topic].partitions) == WIDE


def test_the_proof_refuses_a_re_created_wide_topic(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=WIDE)
    planned = metadata.describe_topics(kafka, [topic])[topic].topic_id
    ranges = [OffsetRange(topic, 0, 0, 1, planned)]

    check_incarnation(kafka, ranges)  # the first proof lists the partitions: the topic is wide now
    assert topic in recreated.brokers(kafka).wide
    check_incarnation(kafka, ranges)  # its id alone: still the planned one
    recreate_topic(kafka_admin, topic, WIDE)
    new = _described_again(kafka, topic, planned)
    with pytest.raises(TopicChanged) as raised:
        check_incarnation(kafka, ranges)
    assert (raised.value.topic, raised.value.planned_id, raised.value.current_id) == (topic, planned, new)


def _described_again(kafka: KafkaSettings, topic: str, old: str) -> str:
    """The re-created topic's id, once the broker describes it (bounded: 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(TopicMissing):
            found = metadata.describe_topics(kafka, [topic])[topic].topic_id
            if found != old:
                return found
        time.sleep(0.2)
    raise AssertionError(f"{topic} was not described with a new id within 30 s")
