"""The data every contender reads: page-view topics produced once per run, and their oracles.

Topics are made with examples/pageviews.produce (skewed users and pages, event times, every 10th
Kafka transaction aborted), so every contender must read with read_committed to be right. The
oracle - views and duration per (1-minute window, page) of the committed records - is what each
contender's result table rows must equal before its time counts.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from examples import pageviews
from txn_offsets.config import KafkaSettings

# (window start ms, page) -> (views, duration ms)
Expected = dict[tuple[int, str], tuple[int, int]]


@dataclass(frozen=True)
class Dataset:
    topic: str
    partitions: int
    messages: int  # committed records (aborted ones are in the log too, never counted)
    aborted: int
    value_bytes: int
    expected: Expected
    produce_seconds: float


def create_topic(
    kafka: KafkaSettings, partitions: int, prefix: str = "bench", timeout_s: float = 120.0
) -> str:
    """A new topic, returned once the broker's metadata shows it with every partition led: the
    creation's future resolves when the controller has it, and a job started at once on a busy
    broker could find no such topic yet (the smoke's latency probe did, while a 4,096-partition
    topic was being created beside it)."""
    topic = f"{prefix}-p{partitions}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka.client_config())
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    deadline = time.monotonic() + timeout_s
    while True:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return topic
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic}: not all {partitions} partitions led after {timeout_s:.0f}s")
        time.sleep(0.2)


def topic_names(kafka: KafkaSettings) -> list[str]:
    """Every topic the cluster has."""
    admin = AdminClient(kafka.client_config())
    return sorted(admin.list_topics(timeout=30).topics)


def delete_topics(kafka: KafkaSettings, topics: list[str]) -> None:
    if not topics:
        return
    admin = AdminClient(kafka.client_config())
    for future in admin.delete_topics(topics).values():
        try:
            future.result(60)
        except Exception as exc:  # best effort: a leftover topic is only disk space
            print(f"bench: could not delete a topic ({exc})", flush=True)


def produce_dataset(
    kafka: KafkaSettings, partitions: int, messages: int, seed: int = 7, *, spread: bool = False
) -> Dataset:
    """A topic of `messages` page views over `partitions`, each in its user's partition (skewed: a
    batch of a few thousand fills a few hundred of 4,096 partitions) or, `spread`, round-robin."""
    topic = create_topic(kafka, partitions)
    t0 = time.perf_counter()
    # small data sets get smaller transactions, so that they too hold aborted ones
    per_transaction = min(5_000, max(10, messages // 20))
    oracle = pageviews.produce(
        kafka.bootstrap_servers,
        topic,
        messages,
        partitions=partitions,
        per_transaction=per_transaction,
        seed=seed,
        spread=spread,
    )
    seconds = time.perf_counter() - t0
    expected = {key: (views, oracle.durations[key]) for key, views in oracle.windows.items()}
    return Dataset(
        topic=topic,
        partitions=partitions,
        messages=oracle.messages,
        aborted=oracle.aborted,
        value_bytes=oracle.value_bytes,
        expected=expected,
        produce_seconds=seconds,
    )


def expected_of(partials: dict[tuple[int, str], list[int]]) -> Expected:
    return {key: (views, duration) for key, (views, duration) in partials.items()}
