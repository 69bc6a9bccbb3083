"""Kafka facts for the service, cached: partitions, watermarks and record timestamps of the topics
the jobs read.

Many scrapers (several Prometheus replicas, Grafana, curl) must cost Kafka one metadata round trip
per ``ttl_s``, not one each: :meth:`KafkaView.facts` returns the cached facts while they are fresh
and otherwise refreshes them once, under a lock, while concurrent callers wait for that refresh
instead of starting their own. A failed refresh is cached too (as an error), so an unreachable
broker is not hammered by every scrape. While the service's background health check finds Kafka
down (:attr:`KafkaView.known_down`), a scrape does not ask Kafka at all: it gets an error at once
instead of waiting for the timeouts.

The topics come from rows tenants write, so one topic must never blind the service for every job
(a row for ``no'such topic`` once failed the whole refresh: ``txn_offsets_up{target="kafka"} 0``
and every job's lag gone). A name Kafka would refuse is never sent; the others are described in
one request whose answer is per topic, and a topic Kafka answers about without facts (unknown, a
name it refuses, not authorised, no leader) is set aside with its reason in
:attr:`KafkaFacts.topic_errors` while every other topic is read as usual. Only Kafka not answering
at all is an error of the whole refresh.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, TopicMissing, TxnOffsetsError
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
    # topic -> why Kafka gave no facts (or only some) for it while it answered; the unknown topics
    # (missing_topics) among them
    topic_errors: Mapping[str, str] = field(default_factory=dict)


# Kafka's own rule for topic names (org.apache.kafka.common.internals.Topic.validate)
_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
REFUSED = "Kafka refuses this topic name (letters, digits, '.', '_' and '-'; 1 to 249 of them)"
UNKNOWN = "Kafka has no topic of this name (never created, or deleted)"
_UNKNOWN_CODES = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}
_REFUSED_CODES = {KafkaError.TOPIC_EXCEPTION}  # "Invalid topic"


def legal_topic(topic: str) -> bool:
    """Whether Kafka accepts `topic` as a name ("." and ".." it refuses too)."""
    return _LEGAL.fullmatch(topic) is not None and topic not in {".", ".."}


def _reason(err: KafkaError) -> str:
    """Why Kafka gave no facts for a topic, in words of our own and the error's name only."""
    if err.code() in _UNKNOWN_CODES:
        return UNKNOWN
    if err.code() in _REFUSED_CODES:
        return REFUSED
    return f"Kafka answered {err.name()} for this topic"


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
        self._problems: dict[str, str] = {}  # topic -> reason, as last logged

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
        from txn_offsets.kafka import timestamps

        problems: dict[str, str] = {}
        try:
            partitions, leaderless = self._describe(sorted(topics), problems)
            marks = self._marks(partitions, leaderless, problems)
            partitions = {t: parts for t, parts in partitions.items() if t not in problems or t in leaderless}
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
        self._log_problems(problems)
        missing = frozenset(t for t, why in problems.items() if why == UNKNOWN)
        return KafkaFacts(topics, partitions, marks, stamps, missing, None, time.time(), problems)

    def _describe(
        self, topics: Sequence[str], problems: dict[str, str]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, set[int]]]:
        """The partitions of each topic, in one request whose answer is per topic; a topic Kafka
        answers about without them goes to `problems`. Also the partitions that have no leader
        (an offline broker): asking for their offsets would wait out the timeout, for every job."""
        from txn_offsets.kafka import admins

        problems.update({t: REFUSED for t in topics if not legal_topic(t)})
        asked = [t for t in topics if t not in problems]
        if not asked:
            return {}, {}
        admin = admins.connected_admin(self.kafka, self.timeout_s)
        futures: dict[str, Future[Any]] = admin.describe_topics(
            TopicCollection(asked), request_timeout=self.timeout_s
        )
        admins.issued(admin, futures.values())
        partitions: dict[str, tuple[int, ...]] = {}
        leaderless: dict[str, set[int]] = {}
        for topic, fut in futures.items():
            try:
                desc = fut.result(timeout=self.timeout_s + 5)
            except TimeoutError:
                said = f"no answer in {self.timeout_s:g}s"
                raise admins.unreachable(self.kafka, "metadata", self.timeout_s + 6, said) from None
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError) or err.code() in admins.NO_ANSWER:
                    # nobody answered: a fresh client next time, and the error says why
                    said = admins.describe_error(exc)
                    raise admins.unreachable(self.kafka, "metadata", self.timeout_s + 6, said) from None
                problems[topic] = _reason(err)
                continue
            partitions[topic] = tuple(sorted(p.id for p in desc.partitions))
            offline = {p.id for p in desc.partitions if p.leader is None or p.leader.id < 0}
            if offline:
                leaderless[topic] = offline
                problems[topic] = f"no leader for partition(s) {', '.join(map(str, sorted(offline)))}"
        return partitions, leaderless

    def _marks(
        self,
        partitions: Mapping[str, tuple[int, ...]],
        leaderless: Mapping[str, set[int]],
        problems: dict[str, str],
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(log start, end) of every partition with a leader. A topic deleted since it was
        described is set aside and the others asked again (at most once per topic)."""
        from txn_offsets.kafka import metadata

        keys = {(t, p) for t, parts in partitions.items() for p in parts if p not in leaderless.get(t, ())}
        while keys:
            try:
                return metadata.watermarks(self.kafka, keys, timeout_s=self.timeout_s)
            except TopicMissing as exc:
                if exc.topic not in {t for t, _ in keys}:
                    raise
                problems[exc.topic] = UNKNOWN
                keys = {(t, p) for t, p in keys if t != exc.topic}
        return {}

    def _log_problems(self, problems: Mapping[str, str]) -> None:
        """One warning when the set of topics without facts changes, not one per refresh (every
        few seconds). Names repr()'d: they come from rows tenants write."""
        if problems == self._problems:
            return
        self._problems = dict(problems)
        if problems:
            shown = ", ".join(f"{t!r} ({why})" for t, why in sorted(problems.items())[:5])
            more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
            logger.warning(
                "Kafka gave no facts for %d topic(s), shown without lag: %s%s", len(problems), shown, more
            )
