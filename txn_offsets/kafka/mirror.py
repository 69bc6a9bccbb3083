"""Kafka consumer-group offsets: the mirror of a job's stored offsets, and reading a group's offsets.

Lag tools (kafka_exporter, kafka-lag-exporter, Burrow, kminion, ``kafka-consumer-groups.sh``) read
consumer-group offsets from Kafka. :class:`GroupMirror` writes a job's committed offsets there,
under a group named after the job, *after* each successful database commit. The mirror is a copy
for those tools and is never read back: PostgreSQL stays the only source of truth. So it is best
effort: a mirror that fails logs a warning, counts the failure and lets the batch go on; it never
raises and never blocks longer than its timeout, and after a failure it waits ``backoff_s`` before
trying again (a broker that is down costs one timeout per backoff, not one per batch). Each attempt
sends every offset the mirror has seen, so one success repairs the partitions earlier failures missed.

It never moves the group backwards. Within a run a partition's offset only grows (until its topic
is re-created: a new topic id starts over). Across runs, every entry carries the run's fencing
generation in its commit metadata (:func:`mirror_metadata`, ``txn_offsets:v1:g=<generation>``),
and each attempt first reads the group's entries of the partitions it is about to send (one round
trip) and skips those a newer generation wrote. A run that failed or was fenced stops at once
(:meth:`GroupMirror.halt`): commits queued but not sent are dropped, not flushed.

:func:`group_offsets` reads a group's committed offsets (``offsets import --from-consumer-group``
and the tests): any tool's entries, whatever their metadata.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable
from txn_offsets.kafka.admins import (
    NO_ANSWER,
    admin_client,
    connected_admin,
    forget_admin_client,
    issued,
    unreachable,
)
from txn_offsets.ranges import TopicPartition

__all__ = ["GroupMirror", "group_offsets", "mirror_generation", "mirror_metadata", "validate_group"]

logger = logging.getLogger(__name__)

_MAX_GROUP = 249

# The commit metadata of the mirror's entries: "txn_offsets:v1:" and comma-separated key=value
# fields, today only g=<the run's generation> (~20 bytes; Kafka allows 4096 by default). A v1 reader
# ignores fields it does not know, so fields can be added; an incompatible format gets a new prefix.
_METADATA_PREFIX = "txn_offsets:v1:"
_GENERATION = re.compile(r"[0-9]{1,18}")


def mirror_metadata(generation: int) -> str:
    """The offset commit metadata of the mirror's entries for a run of `generation`."""
    return f"{_METADATA_PREFIX}g={int(generation)}"


def mirror_generation(metadata: str | None) -> int | None:
    """The generation in a group entry's commit metadata written by the mirror; None for any other
    metadata (another tool's, an empty one, a malformed one)."""
    if not metadata or not metadata.startswith(_METADATA_PREFIX):
        return None
    for field in metadata[len(_METADATA_PREFIX) :].split(","):
        key, eq, value = field.partition("=")
        if key == "g" and eq and _GENERATION.fullmatch(value):
            return int(value)
    return None


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
    """The error's name only (the mirror's lines and errors say which error, not the broker's text)."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else type(exc).__name__


class GroupMirror:
    """Mirror a job's committed offsets to Kafka consumer group `group` (thread-safe).

    `generation` is the fencing generation of the run whose offsets these are: it goes into each
    entry's commit metadata, and entries of a newer generation are never overwritten. Without one
    (None) the mirror writes no metadata and checks none.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        *,
        generation: int | None = None,
        timeout_s: float = 3.0,
        backoff_s: float = 30.0,
        on_failure: Callable[[], object] | None = None,
    ) -> None:
        if not 0 < timeout_s <= 60:
            raise ConfigError("mirror timeout_s", f"{timeout_s!r}: give 0 < seconds <= 60")
        if backoff_s < 0:
            raise ConfigError("mirror backoff_s", f"{backoff_s!r}: give seconds >= 0")
        if generation is not None and (
            isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
        ):
            raise ConfigError("mirror generation", f"{generation!r}: give the run's generation (an int >= 0)")
        self.kafka = kafka
        self.group = validate_group(group)
        self.generation = generation
        self.timeout_s = float(timeout_s)
        self.backoff_s = float(backoff_s)
        # called after each failed attempt (e.g. stats.record_failure(..., "mirror_failed"))
        self.on_failure = on_failure
        self.commits = 0  # successful mirror writes
        self.failures = 0  # attempts that failed (each logged as a warning)
        self.skipped = 0  # calls during a backoff after a failure (offsets kept for the next try)
        self.superseded = 0  # partitions not sent because a newer generation wrote their entry
        self.dropped = 0  # calls after halt(): the run failed or was fenced, nothing more is sent
        self._latest: dict[TopicPartition, int] = {}
        self._topic_ids: dict[TopicPartition, str] = {}
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._closed = False
        self._halted = threading.Event()
        self._told_superseded = False

    def __repr__(self) -> str:
        return (
            f"GroupMirror(group={self.group!r}, generation={self.generation!r}, commits={self.commits}, "
            f"failures={self.failures})"
        )

    def commit(
        self, offsets: Mapping[TopicPartition, int], topic_ids: Mapping[TopicPartition, str] | None = None
    ) -> bool:
        """Record `offsets` (the next offset to read per partition, as committed to PostgreSQL) in the
        group; `topic_ids` names the topic incarnation of each (where known). True if Kafka
        acknowledged them, or a newer generation's entries made them moot; False (never an exception)
        otherwise."""
        try:
            with self._lock:
                if self._closed:
                    return False
                if self._halted.is_set():
                    self.dropped += 1
                    return False
                self._merge(offsets, topic_ids or {})
                if time.monotonic() < self._retry_at:
                    self.skipped += 1
                    return False
                return self._send(dict(self._latest))
        except Exception as exc:  # best effort by contract: nothing may escape into the batch
            self._failed(exc)
            return False

    def halt(self, reason: str) -> None:
        """The run failed or was fenced (`reason`: e.g. the exception's class name): send nothing more.
        Takes effect at once, without waiting for a send in flight (which has passed its generation
        check); later commit() and flush() calls are dropped."""
        if not self._halted.is_set():
            self._halted.set()
            logger.info(
                "mirror of group %r stops: run generation %s ended with %s; offsets not yet sent are "
                "dropped, not sent (the offsets table stays the truth)",
                self.group,
                self.generation,
                reason,
            )

    @property
    def halted(self) -> bool:
        return self._halted.is_set()

    def _merge(self, offsets: Mapping[TopicPartition, int], topic_ids: Mapping[TopicPartition, str]) -> None:
        """Within a run a partition never moves backwards (a late or repeated report cannot undo a
        later one), unless its topic was re-created: a new topic id starts the partition over."""
        for (t, p), o in offsets.items():
            key, offset = (str(t), int(p)), int(o)
            tid, known = topic_ids.get(key), self._topic_ids.get(key)
            if tid is not None and known is not None and tid != known:
                self._latest[key] = offset
            else:
                self._latest[key] = max(offset, self._latest.get(key, offset))
            if tid is not None:
                self._topic_ids[key] = tid

    def _send(self, latest: dict[TopicPartition, int]) -> bool:
        # Kafka has no compare-and-set for group offsets: the generation check reads the entries,
        # then the alter writes them. A newer run's write that lands between the two is overwritten
        # (the race that remains). It is bounded: the check runs right before each send, so the
        # window is one round trip; a run that learns it was fenced stops sending at once (halt());
        # the newer run's next send repairs the entry; and the offsets table stays the truth.
        if not latest:
            return True
        deadline = time.monotonic() + self.timeout_s
        admin = admin_client(self.kafka, "groups")
        checked = self._not_superseded(admin, latest) if self.generation is not None else latest
        if checked is None:
            return False
        latest = checked
        if not latest:
            return True
        gen = self.generation  # KafkaTP takes no metadata=None: give it only with a generation
        entries = [
            KafkaTP(t, p, o) if gen is None else KafkaTP(t, p, o, metadata=mirror_metadata(gen))
            for (t, p), o in sorted(latest.items())
        ]
        request = ConsumerGroupTopicPartitions(self.group, entries)
        remaining = max(0.1, deadline - time.monotonic())
        futures = admin.alter_consumer_group_offsets([request], request_timeout=remaining)
        issued(admin, futures.values())
        try:
            result = futures[self.group].result(timeout=remaining + 1)
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

    def _not_superseded(
        self, admin: Any, latest: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int] | None:
        """`latest` without the partitions whose group entry a newer generation wrote (one round
        trip); None if the entries could not be read (a failed attempt) or the run has failed since
        (halt()): then nothing is sent."""
        request = ConsumerGroupTopicPartitions(self.group, [KafkaTP(t, p) for (t, p) in sorted(latest)])
        futures = admin.list_consumer_group_offsets([request], request_timeout=self.timeout_s)
        issued(admin, futures.values())
        try:
            result = futures[self.group].result(timeout=self.timeout_s + 1)
        except (KafkaException, FutureTimeout, TimeoutError) as exc:
            self._failed(exc)
            return None
        ours = self.generation if self.generation is not None else -1
        newer: dict[TopicPartition, int] = {}
        for tp in result.topic_partitions:
            found = mirror_generation(tp.metadata) if tp.error is None else None
            if found is not None and found > ours:
                newer[(tp.topic, tp.partition)] = found
        if newer:
            self.superseded += len(newer)
            if not self._told_superseded:
                self._told_superseded = True
                logger.info(
                    "mirror of group %r: %d partition(s) not sent, their entries come from a newer "
                    "generation (%d) than this run's (%d): a newer run of the job mirrors them; counted "
                    "from now on, not logged again",
                    self.group,
                    len(newer),
                    max(newer.values()),
                    self.generation,
                )
        if self._halted.is_set():  # the run failed while the entries were read: send nothing
            self.dropped += 1
            return None
        return {key: offset for key, offset in latest.items() if key not in newer}

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
        """Try once more now (ignoring the backoff) with every offset seen; for the end of a run that
        did not fail (after halt() it sends nothing)."""
        try:
            with self._lock:
                if self._closed or self._halted.is_set():
                    return False
                return self._send(dict(self._latest))
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
    admin = connected_admin(kafka, timeout_s, "groups")
    futures = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=timeout_s
    )
    issued(admin, futures.values())
    try:
        result = futures[group].result(timeout=timeout_s + 5)
    except KafkaException as exc:
        said = f"offsets of group {group!r}: {_describe(exc)}"
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in NO_ANSWER:  # why, if librdkafka said
            raise unreachable(kafka, "groups", timeout_s + 6, said) from None
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, said) from None
    except (FutureTimeout, TimeoutError):
        said = f"no offsets of group {group!r} in {timeout_s}s"
        raise unreachable(kafka, "groups", timeout_s + 6, said) from None
    return {
        (tp.topic, tp.partition): int(tp.offset)
        for tp in result.topic_partitions
        if tp.error is None and tp.offset is not None and tp.offset >= 0
    }
