"""The caught-up latency probe: produce -> result committed, per producer batch.

A worker follows a fresh topic (run_job with ``batch_interval_s``, or SSS with a processingTime
trigger of the same interval). This process - outside the system under test - produces page views
at a steady rate, one Kafka transaction every ``every_s`` seconds, each transaction's records on
its own page (``/lat/<k>``), and polls the result table every ``poll_s``: transaction k's latency is
from its ``commit_transaction()`` returning (the records are readable from then on) to the first
poll that finds all of its views. Resolution: ``poll_s`` (50 ms). A page with more views than were
produced is a duplicate and fails the probe.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Producer

from benchmarks.dataset import create_topic, delete_topics
from benchmarks.sink import WrongResult, clear
from benchmarks.stats import percentile
from benchmarks.worker import Worker
from examples.schema import window_counts
from txn_offsets.config import KafkaSettings

WARMUP = "/lat/warmup"


class _Observer(threading.Thread):
    """Polls the result table; records when each expected page is complete."""

    def __init__(self, engine: sa.Engine, topic: str, poll_s: float) -> None:
        super().__init__(name="bench-latency-observer", daemon=True)
        self.engine, self.topic, self.poll_s = engine, topic, poll_s
        self.expected: dict[str, int] = {}  # page -> views, set once its transaction committed
        self.done: dict[str, float] = {}  # page -> monotonic time it was first complete
        self.error: str | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        query = (
            sa.select(window_counts.c.page, sa.func.sum(window_counts.c.views))
            .where(window_counts.c.topic == self.topic)
            .group_by(window_counts.c.page)
        )
        with self.engine.connect() as conn:
            while not self.halt.wait(self.poll_s):
                rows = conn.execute(query).all()
                conn.rollback()  # a fresh snapshot at each poll
                now = time.monotonic()
                for page, views in rows:
                    want = self.expected.get(page)
                    if want is None or page in self.done:
                        continue
                    if views > want:
                        self.error = f"page {page}: {views} views, {want} produced (a duplicate)"
                    elif views == want:
                        self.done[page] = now

    def wait_for(self, pages: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.error is None:
            if all(p in self.done for p in pages):
                return
            time.sleep(self.poll_s)
        if self.error is not None:
            raise WrongResult(f"latency probe on {self.topic}: {self.error}")
        missing = [p for p in pages if p not in self.done]
        raise WrongResult(
            f"latency probe on {self.topic}: {len(missing)} batches not committed after {timeout_s:.0f}s"
        )


def _transaction(
    producer: Producer, topic: str, page: str, n: int, *, partitions: int, rng: random.Random
) -> None:
    producer.begin_transaction()
    now_ms = int(time.time() * 1000)
    for i in range(n):
        user = f"user-{rng.randrange(50_000)}"
        value = json.dumps(
            {"u": user, "p": page, "t": now_ms, "d": rng.randint(20, 4_000)}, separators=(",", ":")
        )
        producer.produce(
            topic, key=user.encode(), value=value.encode(), partition=i % partitions, timestamp=now_ms
        )
    producer.commit_transaction(30)


def probe(
    worker: Worker,
    kafka: KafkaSettings,
    engine: sa.Engine,
    *,
    partitions: int,
    cap: int,
    rate: int,
    seconds: float,
    interval_s: float,
    every_s: float = 0.1,
    poll_s: float = 0.05,
) -> dict[str, Any]:
    """Follow a fresh topic with `worker`, produce `rate` records/s for `seconds`, return latencies."""
    topic = create_topic(kafka, partitions, prefix="bench-latency")
    observer = _Observer(engine, topic, poll_s)
    rng = random.Random(11)
    per_txn = max(1, round(rate * every_s))
    producer = Producer(
        {**kafka.client_config(), "transactional.id": f"bench-latency-{uuid.uuid4().hex}", "linger.ms": 1}
    )
    producer.init_transactions(30)
    worker.call("follow", timeout_s=300, topic=topic, partitions=partitions, cap=cap, interval_s=interval_s)
    usage: dict[str, Any] = {}
    committed: dict[str, float] = {}
    try:
        observer.start()
        # warm-up: the first batch starts Python workers, consumers and connections
        _transaction(producer, topic, WARMUP, per_txn, partitions=partitions, rng=rng)
        observer.expected[WARMUP] = per_txn
        observer.wait_for([WARMUP], timeout_s=180)
        time.sleep(1.0)
        start = time.monotonic()
        k = 0
        while True:
            due = start + k * every_s
            if due - start >= seconds:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            page = f"/lat/{k}"
            _transaction(producer, topic, page, per_txn, partitions=partitions, rng=rng)
            committed[page] = time.monotonic()
            observer.expected[page] = per_txn
            k += 1
        observer.wait_for(list(committed), timeout_s=120)
    finally:
        observer.halt.set()
        try:
            usage = worker.call("unfollow", timeout_s=300)
        finally:
            observer.join(10)
            clear(engine, topic)
            delete_topics(kafka, [topic])
    latencies = [observer.done[p] - t for p, t in committed.items()]
    return {
        "topic_partitions": partitions,
        "rate": rate,
        "seconds": seconds,
        "interval_s": interval_s,
        "producer_batches": len(committed),
        "records": len(committed) * per_txn,
        "p50_ms": 1000 * (percentile(latencies, 50) or 0.0),
        "p99_ms": 1000 * (percentile(latencies, 99) or 0.0),
        "max_ms": 1000 * max(latencies),
        "peak_rss_mb": usage.get("peak_rss_mb"),
        "cpu_s": usage.get("cpu_s"),
    }
