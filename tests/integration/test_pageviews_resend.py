"""The examples' producer never counts a record whose delivery it cannot confirm: a committed
transaction's delivery report without an offset (librdkafka's idempotent producer, after a
"possibly persisted" send answered DUPLICATE_SEQUENCE_NUMBER) may be a record Kafka does not hold.
Seen on the stack: 1-2 records of a 1,024-partition topic's first transaction missing from the log
while the oracle counted them, and the scale bench stopped with WrongResult blaming the job. The
transaction is aborted and sent again; the topic then holds each record once, as the oracle says.

The broker and the producer are real; only the first attempt's delivery reports are made to look
unconfirmed (the broker's answer cannot be provoked on demand)."""

from __future__ import annotations

import collections
import time
import uuid
from typing import Any

import msgspec
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from chaos.invariants import _settled_watermarks
from examples import pageviews
from tests.fix_services import TopicFactory


def _committed_views(bootstrap: str, topic: str, partitions: int) -> collections.Counter[tuple[int, str]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    # COMMIT returns before the markers are written: read once the LSO has reached the end
    _settled_watermarks(consumer, bootstrap, {topic: partitions})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: collections.Counter[tuple[int, str]] = collections.Counter()
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                ended.add(msg.partition())
                continue
            view = msgspec.json.decode(msg.value(), type=pageviews.PageView)
            seen[(pageviews.window_of(view.time_ms), view.page)] += 1
    finally:
        consumer.close()
    assert len(ended) == partitions, "the topic was not read to its end"
    return seen


@pytest.mark.parametrize("blind", [1, 2])
def test_an_unconfirmed_transaction_is_aborted_and_sent_again(
    kafka_bootstrap: str, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch, blind: int
) -> None:
    topic = topic_factory(2)
    real_send = pageviews._send
    attempts: list[int] = []

    def send(*args: Any) -> list[tuple[Any, int | None]]:
        delivered = real_send(*args)  # really produced, in the open transaction
        attempts.append(len(delivered))
        if len(attempts) <= blind:  # the first transaction's first `blind` attempts
            delivered[0] = (None, None)
        return delivered

    monkeypatch.setattr(pageviews, "_send", send)
    oracle = pageviews.produce(
        kafka_bootstrap, topic, 120, partitions=2, per_transaction=40, abort_every=0, seed=3
    )
    # 3 transactions, the first sent 1 + blind times; nothing of an unconfirmed attempt is committed
    assert attempts == [40] * (3 + blind)
    assert oracle.messages == 120
    assert oracle.aborted == 40 * blind
    assert _committed_views(kafka_bootstrap, topic, 2) == oracle.windows


def test_a_transaction_never_confirmed_stops_the_producer(
    kafka_bootstrap: str, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = topic_factory(1)
    real_send = pageviews._send

    def send(*args: Any) -> list[tuple[Any, int | None]]:
        return [(None, None) for _ in real_send(*args)]

    monkeypatch.setattr(pageviews, "_send", send)
    with pytest.raises(RuntimeError, match=r"aborted 3 times: 10 deliveries reported without an offset"):
        pageviews.produce(kafka_bootstrap, topic, 10, partitions=1, per_transaction=10, abort_every=0)
    assert _committed_views(kafka_bootstrap, topic, 1) == collections.Counter()
