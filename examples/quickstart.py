"""Quickstart: produce keyed events to Kafka, count them per key into PostgreSQL, verify the counts.

A small real job on the local stack (``make demo``) or in docker-compose: it creates a fresh topic,
produces ``--messages`` records over 8 partitions, reads them back under read_committed and writes
per-key totals to ``quickstart_counts`` in one transaction, then checks them against what it produced.
The last line is ``demo: messages=<N> batches=<B> seconds=<S> verified=ok|FAILED``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import uuid

import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from txn_offsets.config import from_env


def produce(bootstrap: str, topic: str, n: int) -> collections.Counter[str]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    expected: collections.Counter[str] = collections.Counter()
    for i in range(n):
        key = f"user-{(i * 7919) % 97}"
        expected[key] += 1
        producer.produce(topic, key=key.encode(), value=b"1")
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise SystemExit("demo: producer could not deliver every record")
    return expected


def consume(bootstrap: str, topic: str, partitions: int, n: int) -> collections.Counter[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"quickstart-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    counts: collections.Counter[str] = collections.Counter()
    seen = 0
    deadline = time.monotonic() + 120
    while seen < n and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=1.0):
            if msg.error() is not None:
                raise SystemExit(f"demo: kafka error {msg.error()}")
            counts[msg.key().decode()] += 1
            seen += 1
    consumer.close()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    db, kafka = from_env()
    started = time.monotonic()
    topic = f"quickstart-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka.client_config())
    admin.create_topics([NewTopic(topic, 8, 1)])[topic].result(30)
    expected = produce(kafka.bootstrap_servers, topic, args.messages)
    counts = consume(kafka.bootstrap_servers, topic, 8, args.messages)
    engine = sa.create_engine(db.url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS quickstart_counts "
                "(topic text, k text, n bigint NOT NULL, PRIMARY KEY (topic, k))"
            )
        )
        conn.execute(
            sa.text("INSERT INTO quickstart_counts (topic, k, n) VALUES (:t, :k, :n)"),
            [{"t": topic, "k": k, "n": n} for k, n in counts.items()],
        )
    with engine.connect() as conn:
        stored = dict(
            conn.execute(sa.text("SELECT k, n FROM quickstart_counts WHERE topic = :t"), {"t": topic}).all()
        )
    engine.dispose()
    ok = stored == dict(expected)
    for k, n in sorted(stored.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {k:10} {n}")
    verdict = "ok" if ok else f"FAILED expected={sum(expected.values())} stored={sum(stored.values())}"
    seconds = time.monotonic() - started
    print(f"demo: messages={args.messages} batches=1 seconds={seconds:.1f} verified={verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
