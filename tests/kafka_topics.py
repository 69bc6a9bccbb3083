"""A topic deleted and created again under the same name (a new Kafka topic id), as tests of the
data-loss and topic-incarnation checks need it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import metadata


def recreate_topic(admin: AdminClient | str, topic: str, partitions: int, gone_s: float = 0.0) -> None:
    """Delete `topic` and create it again with `partitions` partitions, leaving it absent for at
    least `gone_s` seconds (`admin`: a client, or the bootstrap servers to make one). Deletion
    completes asynchronously: the creation is retried, bounded (60 s)."""
    if isinstance(admin, str):
        admin = AdminClient({"bootstrap.servers": admin})
    delete_topic(admin, topic)
    time.sleep(gone_s)
    deadline = time.monotonic() + 60
    while True:
        try:
            new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
            admin.create_topics([new])[topic].result(timeout=30)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Delete `topic` and return once the broker's metadata no longer names it: the deletion's
    future resolves when the controller has committed it, a broker applies it a moment later, and
    a plan made in between still sees the topic (bounded, 30 s)."""
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while (listed := admin.list_topics(topic, timeout=10).topics.get(topic)) and listed.error is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {topic!r} is still listed 30 s after its deletion")
        time.sleep(0.1)


def old_log_first(monkeypatch: pytest.MonkeyPatch, old_marks: tuple[int, int]) -> list[int]:
    """Kafka's first (log start, end) answer (:func:`txn_offsets.kafka.metadata.watermarks`) is
    `old_marks` - the old log's, as a lagging leader gave them on the lab - later ones real: the
    calls made, one entry each."""
    real = metadata.watermarks
    calls: list[int] = []

    def answer(kafka: KafkaSettings, tps: Any, **kw: Any) -> dict[tuple[str, int], tuple[int, int]]:
        calls.append(1)
        return dict.fromkeys(tps, old_marks) if len(calls) == 1 else real(kafka, tps, **kw)

    monkeypatch.setattr(metadata, "watermarks", answer)
    return calls
