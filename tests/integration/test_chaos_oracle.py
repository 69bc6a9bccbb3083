"""The chaos oracle reads Kafka only once no transaction is open (found by F18: right after a
producer's last COMMIT the LSO can still sit at the start of that transaction, and the oracle then
missed its records and reported them as duplicated)."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from chaos.invariants import _settled_watermarks
from tests.fix_services import TopicFactory


def test_the_oracle_waits_while_a_transaction_is_open(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    topic = topic_factory(1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"v")
    producer.flush(10)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        with caplog.at_level(logging.WARNING, logger="chaos.invariants"):
            marks = _settled_watermarks(consumer, kafka_bootstrap, {topic: 1}, timeout_s=1.0)
        # the LSO stays at the open transaction's first record; the oracle said it waited for it
        assert marks[(topic, 0)] == (0, 0)
        assert any("still have an open transaction" in r.getMessage() for r in caplog.records)
    finally:
        producer.abort_transaction(10)
        consumer.close()
