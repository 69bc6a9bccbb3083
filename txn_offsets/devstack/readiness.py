"""Readiness probes that do real work: a Kafka produce -> consume round trip."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from txn_offsets.kafka.clients import client_config

READY_TOPIC = "_txn_offsets_ready"


def kafka_round_trip(bootstrap: str, *, timeout_s: float = 20.0) -> None:
    """Produce one unique record and read it back; raise if that does not happen in time."""
    base = client_config({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000, "log_level": 2})
    admin = AdminClient(base)
    futures = admin.create_topics(
        [NewTopic(READY_TOPIC, num_partitions=1, replication_factor=1)], request_timeout=timeout_s
    )
    try:
        futures[READY_TOPIC].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    token = uuid.uuid4().hex.encode()
    delivered: list[int] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            raise KafkaException(err)
        delivered.append(msg.offset())  # type: ignore[attr-defined]

    producer = Producer({**base, "acks": "all", "message.timeout.ms": int(timeout_s * 1000)})
    producer.produce(READY_TOPIC, value=token, on_delivery=on_delivery)
    if producer.flush(timeout_s) != 0 or not delivered:
        raise TimeoutError("the ready probe record was not acknowledged")
    consumer = Consumer(
        {**base, "group.id": f"_txn_offsets_ready_{token.decode()}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(READY_TOPIC, 0, delivered[0])])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                raise KafkaException(msg.error())
            if msg.value() == token:
                return
        raise TimeoutError("the ready probe record was not read back")
    finally:
        consumer.close()
