"""The caught-up latency probe: produce -> result committed, per producer batch.

A worker follows a fresh topic (run_job with ``batch_interval_s``, run_job in low-latency mode
(benchmarks/lowlatency.py), SSS with a processingTime trigger of the same interval, or a
real-time-mode query). This process - outside the system under
test - produces page views at a steady rate, one Kafka transaction every ``every_s`` seconds, each
transaction's records on its own page (``/lat/<k>``), and polls the result table every ``poll_s``
(5 ms): transaction k's latency is from its ``commit_transaction()`` returning (the records are
readable from then on) to the first poll that finds all of its views. Each poll asks only for the
pages still pending (an index lookup on the result table's key), so it stays cheap as results
accumulate; the probe reports its own cost (polls, mean poll time, its thread's CPU seconds and
share of the wall time) beside the latencies. A page with more views than were produced is a
duplicate and fails the probe.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Producer
from sqlalchemy.dialects import postgresql

from benchmarks.dataset import create_topic, delete_topics
from benchmarks.settings import (
    EO_LOW_LATENCY,
    EO_PARTITION,
    LATENCY_FOLLOWERS,
    LATENCY_PARTITIONS,
    LATENCY_RATE,
    RTM_ALO,
    RTM_EO,
    SSS,
)
from benchmarks.sink import WrongResult, clear
from benchmarks.stats import percentile
from benchmarks.worker import Spec, Worker
from examples.schema import window_counts
from txn_offsets.config import KafkaSettings

WARMUP = "/lat/warmup"
FOLLOW_INTERVAL_S = 0.5  # run_job's batch_interval_s and SSS's trigger when following
# the followers a worker can run (benchmarks/worker.py ``follow``)
RUNNABLE = (EO_PARTITION, EO_LOW_LATENCY, SSS, RTM_ALO, RTM_EO)


class _Observer(threading.Thread):
    """Polls the result table; records when each expected page is complete."""

    def __init__(self, engine: sa.Engine, topic: str, poll_s: float) -> None:
        super().__init__(name="bench-latency-observer", daemon=True)
        self.engine, self.topic, self.poll_s = engine, topic, poll_s
        self.expected: dict[str, int] = {}  # page -> views, set once its transaction committed
        self.done: dict[str, float] = {}  # page -> monotonic time it was first complete
        self.error: str | None = None
        self.halt = threading.Event()
        self.lock = threading.Lock()
        # the probe's own cost: polls made, seconds inside them, this thread's CPU and wall seconds
        self.polls, self.busy_s, self.cpu_s, self.wall_s = 0, 0.0, 0.0, 0.0

    def run(self) -> None:
        c = window_counts.c
        pages = sa.bindparam("pages", type_=postgresql.ARRAY(sa.Text))
        query = (
            sa.select(c.page, sa.func.sum(c.views))
            .where(c.topic == sa.bindparam("topic"), c.page == sa.any_(pages))
            .group_by(c.page)
        )
        cpu0, wall0 = time.thread_time(), time.monotonic()
        with self.engine.connect() as conn:
            while not self.halt.wait(self.poll_s):
                with self.lock:
                    pending = {p: n for p, n in self.expected.items() if p not in self.done}
                if not pending:
                    continue
                t0 = time.monotonic()
                rows = conn.execute(query, {"topic": self.topic, "pages": list(pending)}).all()
                conn.rollback()  # a fresh snapshot at each poll
                now = time.monotonic()
                self.polls += 1
                self.busy_s += now - t0
                for page, views in rows:
                    want = pending[page]
                    if views > want:
                        self.error = f"page {page}: {views} views, {want} produced (a duplicate)"
                    elif views == want:
                        self.done[page] = now
        self.cpu_s = time.thread_time() - cpu0
        self.wall_s = time.monotonic() - wall0

    def expect(self, page: str, views: int) -> None:
        with self.lock:
            self.expected[page] = views

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
    poll_s: float = 0.005,
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
        observer.expect(WARMUP, per_txn)
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
            observer.expect(page, per_txn)
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
        "poll_ms": 1000 * poll_s,
        "probe_polls": observer.polls,
        "probe_poll_ms_mean": 1000 * observer.busy_s / observer.polls if observer.polls else None,
        "probe_cpu_s": observer.cpu_s,
        "probe_cpu_share": observer.cpu_s / observer.wall_s if observer.wall_s else None,
    }


def phase(
    spec_of: Callable[[str], Spec], kafka: KafkaSettings, engine: sa.Engine, *, cap: int, seconds: float
) -> list[dict[str, Any]]:
    """The latency phase: every follower of LATENCY_FOLLOWERS on a fresh topic of LATENCY_PARTITIONS
    partitions at LATENCY_RATE records/s, a worker each, one after the other. A follower without
    an entry point (none today: RUNNABLE) would be reported with None (n/a)."""
    runs: list[dict[str, Any]] = []
    for contender in LATENCY_FOLLOWERS:
        if contender not in RUNNABLE:
            runs.append({"contender": contender, "p50_ms": None, "p99_ms": None})
            print(f"bench: latency phase {contender:14} n/a (no entry point yet)", flush=True)
            continue
        worker = Worker(spec_of(contender))
        try:
            found = probe(
                worker,
                kafka,
                engine,
                partitions=LATENCY_PARTITIONS,
                cap=cap,
                rate=LATENCY_RATE,
                seconds=seconds,
                interval_s=FOLLOW_INTERVAL_S,
            )
        finally:
            worker.close()
        runs.append({"contender": contender, **found})
        print(
            f"bench: latency phase {contender:14} {found['records']:,} records: "
            f"p50 {found['p50_ms']:.1f} ms, "
            f"p99 {found['p99_ms']:.1f} ms, max {found['max_ms']:.1f} ms; the probe: {found['probe_polls']} "
            f"polls of {found['probe_poll_ms_mean'] or 0:.2f} ms, "
            f"{100 * (found['probe_cpu_share'] or 0):.1f} % of a core",
            flush=True,
        )
    return runs
