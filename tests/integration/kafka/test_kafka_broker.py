"""The real broker: plain produce/consume and transactions read back under read_committed."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings


def _read_all(bootstrap: str, topic: str, isolation: str, expected_end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "error",
        }
    )
    out: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(200):  # bounded: at most ~100 s
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.offset(), msg.value()))
            if consumer.position([TopicPartition(topic, 0)])[0].offset >= expected_end:
                break
        else:
            pytest.fail(f"{isolation} consumer of {topic}[0] never reached offset {expected_end}")
    finally:
        consumer.close()
    return out


def test_plain_produce_consume(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, key=str(i % 7).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0
    got = _read_all(kafka_bootstrap, topic, "read_uncommitted", 100)
    assert [v for _, v in got] == [f"v{i}".encode() for i in range(100)]
    assert [o for o, _ in got] == list(range(100))


def test_transactions_committed_and_aborted(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)
    # 10 records + commit marker + 5 aborted records + abort marker = end offset 17
    assert settled_ends(kafka_bootstrap, topic, 1) == {(topic, 0): 17}
    committed = _read_all(kafka_bootstrap, topic, "read_committed", 17)
    assert [v for _, v in committed] == [f"committed-{i}".encode() for i in range(10)]
    everything = _read_all(kafka_bootstrap, topic, "read_uncommitted", 17)
    assert len(everything) == 15  # markers are never delivered, aborted records are under read_uncommitted
    assert {v for _, v in everything} >= {f"aborted-{i}".encode() for i in range(5)}


def _producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    return producer


def test_settled_ends_wait_for_the_markers(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    """commit/abort_transaction return before the markers are written, so the LSO read right after
    them is often short (CI: (0, 6) != (0, 8)); settled_ends is exact after every transaction."""
    topic = topic_factory(partitions=2)
    producer = _producer(kafka_bootstrap)
    expected = {(topic, 0): 0, (topic, 1): 0}
    for i in range(24):
        producer.begin_transaction()
        producer.produce(topic, value=b"x", partition=i % 2)
        producer.produce(topic, value=b"y", partition=i % 2)
        producer.flush(30)
        if i % 3:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        expected[(topic, i % 2)] += 3  # two records and a marker
        assert settled_ends(kafka_bootstrap, topic, 2) == expected, f"after transaction {i}"


def test_settled_ends_fail_clearly_on_an_open_transaction(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=2)
    producer = _producer(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=1)
    producer.flush(30)
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=rf"within 1s: {topic}\[1\] LSO 0 < high watermark 1 \("):
        settled_ends(KafkaSettings(kafka_bootstrap), topic, [0, 1], timeout_s=1)
    assert time.monotonic() - t0 < 10
    producer.abort_transaction(30)
    assert settled_ends(kafka_bootstrap, topic, [1]) == {(topic, 1): 2}
