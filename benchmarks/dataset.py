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


def create_topic(kafka: KafkaSettings, partitions: int, prefix: str = "bench") -> str:
    topic = f"{prefix}-p{partitions}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka.client_config())
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    return topic


def delete_topics(kafka: KafkaSettings, topics: list[str]) -> None:
    if not topics:
        return
    admin = AdminClient(kafka.client_config())
    for future in admin.delete_topics(topics).values():
        try:
            future.result(60)
        except Exception as exc:  # best effort: a leftover topic is only disk space
            print(f"bench: could not delete a topic ({exc})", flush=True)


def produce_dataset(kafka: KafkaSettings, partitions: int, messages: int, seed: int = 7) -> Dataset:
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
