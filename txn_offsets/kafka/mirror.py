"""Kafka consumer-group offsets: the mirror of a job's stored offsets, and reading a group's offsets.

Lag tools (kafka_exporter, kafka-lag-exporter, Burrow, kminion, ``kafka-consumer-groups.sh``) read
consumer-group offsets from Kafka. :class:`GroupMirror` writes a job's committed offsets there,
under a group named after the job, *after* each successful database commit. The mirror is a copy
for those tools and is never read back: PostgreSQL stays the only source of truth. So it is best
effort: a mirror that fails logs a warning, counts the failure and lets the batch go on; it never
raises and never blocks longer than its timeout, and after a failure it waits ``backoff_s`` before
trying again (a broker that is down costs one timeout per backoff, not one per batch). Each attempt
sends every offset the mirror has seen, so one success repairs the partitions earlier failures missed.

:func:`group_offsets` reads a group's committed offsets (``offsets import --from-consumer-group``
and the tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable
from txn_offsets.kafka.metadata import admin_client, forget_admin_client
from txn_offsets.ranges import TopicPartition

__all__ = ["GroupMirror", "group_offsets", "validate_group"]

logger = logging.getLogger(__name__)

_MAX_GROUP = 249


def validate_group(group: str) -> str:
    """A consumer group id: non-empty, printable, no surrounding blanks, at most 249 characters."""
    if (
        not isinstance(group, str)
        or not group
        or group != group.strip()
        or not group.isprintable()
        or len(group) > _MAX_GROUP
    ):
        raise ConfigError(
            "group",
            f"{group!r}: give a printable consumer group id of 1-{_MAX_GROUP} characters, "
            f"without surrounding blanks",
        )
    return group


def _describe(exc: BaseException) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else type(exc).__name__


class GroupMirror:
    """Mirror a job's committed offsets to Kafka consumer group `group` (thread-safe)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        *,
        timeout_s: float = 3.0,
        backoff_s: float = 30.0,
        on_failure: Callable[[], object] | None = None,
    ) -> None:
        if not 0 < timeout_s <= 60:
            raise ConfigError("mirror timeout_s", f"{timeout_s!r}: give 0 < seconds <= 60")
        if backoff_s < 0:
            raise ConfigError("mirror backoff_s", f"{backoff_s!r}: give seconds >= 0")
        self.kafka = kafka
        self.group = validate_group(group)
        self.timeout_s = float(timeout_s)
        self.backoff_s = float(backoff_s)
        # called after each failed attempt (e.g. stats.record_failure(..., "mirror_failed"))
        self.on_failure = on_failure
        self.commits = 0  # successful mirror writes
        self.failures = 0  # attempts that failed (each logged as a warning)
        self.skipped = 0  # calls during a backoff after a failure (offsets kept for the next try)
        self._latest: dict[TopicPartition, int] = {}
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"GroupMirror(group={self.group!r}, commits={self.commits}, failures={self.failures})"

    def commit(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Record `offsets` (the next offset to read per partition, as committed to PostgreSQL) in the
        group. True if Kafka acknowledged them; False (never an exception) otherwise."""
        try:
            with self._lock:
                if self._closed:
                    return False
                self._latest.update({(str(t), int(p)): int(o) for (t, p), o in offsets.items()})
                if time.monotonic() < self._retry_at:
                    self.skipped += 1
                    return False
                return self._send(dict(self._latest))
        except Exception as exc:  # best effort by contract: nothing may escape into the batch
            self._failed(exc)
            return False

    def _send(self, latest: dict[TopicPartition, int]) -> bool:
        if not latest:
            return True
        request = ConsumerGroupTopicPartitions(
            self.group, [KafkaTP(t, p, o) for (t, p), o in sorted(latest.items())]
        )
        futures = admin_client(self.kafka).alter_consumer_group_offsets(
            [request], request_timeout=self.timeout_s
        )
        try:
            result = futures[self.group].result(timeout=self.timeout_s + 1)
        except (KafkaException, FutureTimeout, TimeoutError) as exc:
            self._failed(exc)
            return False
        bad = [tp for tp in result.topic_partitions if tp.error is not None]
        if bad:
            # Kafka applies the others; a partition it rejects (e.g. deleted) is not sent again
            # until a later batch commits it anew, so it cannot block the mirror for good
            for tp in bad:
                self._latest.pop((tp.topic, tp.partition), None)
            self._failed(KafkaException(bad[0].error))
            return False
        self.commits += 1
        return True

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        forget_admin_client(self.kafka)  # the next try connects afresh
        self._retry_at = time.monotonic() + self.backoff_s
        logger.warning(
            "mirror of group %r to Kafka failed (%s; %d failure(s) so far); the database commit stands, "
            "next try in %.0fs",
            self.group,
            _describe(exc),
            self.failures,
            self.backoff_s,
        )
        if self.on_failure is not None:
            try:
                self.on_failure()
            except Exception as counter_exc:  # a failing counter must not break the batch either
                logger.warning("mirror failure counter failed: %s", type(counter_exc).__name__)

    def flush(self) -> bool:
        """Try once more now (ignoring the backoff) with every offset seen; for the end of a run."""
        try:
            with self._lock:
                return not self._closed and self._send(dict(self._latest))
        except Exception as exc:
            self._failed(exc)
            return False

    def close(self) -> None:
        """Stop mirroring (the shared AdminClient stays open for the process)."""
        with self._lock:
            self._closed = True


def group_offsets(kafka: KafkaSettings, group: str, *, timeout_s: float = 10.0) -> dict[TopicPartition, int]:
    """The committed offset of every partition of consumer group `group` (partitions without one are
    left out). An empty answer means the group has no committed offsets (or does not exist)."""
    validate_group(group)
    futures = admin_client(kafka).list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=timeout_s
    )
    try:
        result = futures[group].result(timeout=timeout_s + 5)
    except KafkaException as exc:
        raise ServiceUnavailable(
            "Kafka", kafka.bootstrap_servers, f"offsets of group {group!r}: {_describe(exc)}"
        ) from None
    except (FutureTimeout, TimeoutError):
        raise ServiceUnavailable(
            "Kafka", kafka.bootstrap_servers, f"no offsets of group {group!r} in {timeout_s}s"
        ) from None
    return {
        (tp.topic, tp.partition): int(tp.offset)
        for tp in result.topic_partitions
        if tp.error is None and tp.offset is not None and tp.offset >= 0
    }
