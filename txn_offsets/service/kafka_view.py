"""Kafka facts for the service, cached: partitions, watermarks and record timestamps of the topics
the jobs read.

Many scrapers (several Prometheus replicas, Grafana, curl) must cost Kafka one metadata round trip
per ``ttl_s``, not one each: :meth:`KafkaView.facts` returns the cached facts while they are fresh
and otherwise refreshes them once, under a lock, while concurrent callers wait for that refresh
instead of starting their own. A failed refresh is cached too (as an error), so an unreachable
broker is not hammered by every scrape. While the service's background health check finds Kafka
down (:attr:`KafkaView.known_down`), a scrape does not ask Kafka at all: it gets an error at once
instead of waiting for the timeouts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, TxnOffsetsError
from txn_offsets.ranges import TopicPartition

__all__ = ["KafkaFacts", "KafkaView"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaFacts:
    """What Kafka said at `fetched_at` (epoch seconds) about a set of topics."""

    topics: frozenset[str]
    partitions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    marks: Mapping[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # (log start, end)
    # (topic, partition, position) -> timestamp (ms) of the first record at or after the position
    timestamps: Mapping[tuple[str, int, int], int | None] = field(default_factory=dict)
    missing_topics: frozenset[str] = frozenset()
    error: str | None = None  # Kafka unreachable: one line, no secrets
    fetched_at: float = 0.0


class KafkaView:
    """Cached, single-flight Kafka queries for one cluster (thread-safe)."""

    def __init__(self, kafka: KafkaSettings, *, ttl_s: float = 5.0, timeout_s: float = 5.0) -> None:
        if not ttl_s >= 0:
            raise ConfigError("--kafka-cache-s", f"{ttl_s!r}: give a number of seconds >= 0")
        self.kafka = kafka
        self.ttl_s = float(ttl_s)
        self.timeout_s = float(timeout_s)
        self.refreshes = 0  # round trips made (for the service's own metrics and tests)
        self._lock = threading.Lock()
        self._facts: KafkaFacts | None = None
        self._at = 0.0  # monotonic time of the cached facts
        # the error class of a failed health check of Kafka, None while it answers
        self.known_down: Callable[[], str | None] = lambda: None

    def facts(self, stored: Mapping[TopicPartition, Collection[int]]) -> KafkaFacts:
        """Facts covering the topics of `stored`: per partition the stored positions of every job
        (where record timestamps are read)."""
        topics = frozenset(t for t, _ in stored)
        if not self._fresh(topics):
            down = self.known_down()
            if down is not None:  # not cached: the next scrape after Kafka is back asks it
                problem = f"the service's last health check of Kafka failed ({down})"
                error = ServiceUnavailable("Kafka", self.kafka.bootstrap_servers, problem)
                return KafkaFacts(topics, error=str(error), fetched_at=time.time())
        with self._lock:
            if self._fresh(topics) and self._facts is not None:
                return self._facts
            self._facts = self._refresh(topics, stored)
            self._at = time.monotonic()
            self.refreshes += 1
            return self._facts

    def _fresh(self, topics: frozenset[str]) -> bool:
        cached = self._facts
        return cached is not None and time.monotonic() - self._at < self.ttl_s and topics <= cached.topics

    def _refresh(
        self, topics: frozenset[str], stored: Mapping[TopicPartition, Collection[int]]
    ) -> KafkaFacts:
        from txn_offsets.kafka import metadata, timestamps

        try:
            partitions: dict[str, tuple[int, ...]] = {}
            missing = set()
            for topic in sorted(topics):
                try:
                    partitions[topic] = tuple(
                        metadata.partitions_for(self.kafka, topic, timeout_s=self.timeout_s)
                    )
                except ConfigError:  # deleted: its stored offsets stay visible, without lag
                    missing.add(topic)
            keys = {(t, p) for t, parts in partitions.items() for p in parts}
            marks = metadata.watermarks(self.kafka, keys, timeout_s=self.timeout_s) if keys else {}
            # below the log start the oldest record left is the first one; a partition without a
            # row starts there too
            wanted = {
                k: sorted({max(pos, lo) for pos in stored.get(k, (lo,))} - {end})
                for k, (lo, end) in marks.items()
            }
            stamps: dict[tuple[str, int, int], int | None] = {}
            # one assignment per partition and call: jobs at different positions of one partition
            # are read in layers
            while any(wanted.values()):
                layer = {k: positions.pop() for k, positions in wanted.items() if positions}
                layer = {k: pos for k, pos in layer.items() if pos < marks[k][1]}
                got = timestamps.first_timestamps(self.kafka, layer, timeout_s=self.timeout_s)
                stamps.update({(t, p, layer[(t, p)]): ts for (t, p), ts in got.items()})
        except TxnOffsetsError as exc:
            logger.warning("Kafka facts not refreshed: %s", exc)
            return KafkaFacts(topics, error=str(exc), fetched_at=time.time())
        return KafkaFacts(topics, partitions, marks, stamps, frozenset(missing), None, time.time())
