"""The consumers that read offset ranges: their settings and the per-process pool.

A Spark Python worker reads many ranges, one task at a time, and connecting a new consumer costs
more than reading a small range: :data:`pool` keeps one idle consumer per Kafka settings, and a range
read assigns and seeks instead of connecting anew (as Spark's own Kafka source pools its consumers).

A consumer assigned a partition of a topic it has no metadata for fetches that metadata by itself,
but librdkafka rate-limits those lookups: measured on the local broker, the first record of a range
on the third and later new topics of one consumer arrived after ~1 s (995-1,001 ms), instead of
3 ms. Many jobs in one application (a topic each) paid that once per topic and Python worker - most
of their time. :meth:`ConsumerPool.take` therefore asks the broker for the metadata of the topics
the consumer has not yet read (one request each, a few ms) before the caller assigns them.

A pooled consumer is retired after :data:`RETIRE_AFTER_ASSIGNMENTS` partition assignments: each
assign() and unassign() of many partitions leaves librdkafka's consumer (2.16) slower for good.
Measured on the local broker, one consumer reading 2 x 2,048 ranges of 2 records a batch (a job at
4,096 partitions) took 0.29-0.59 s for its first batch and 1.9-2.4 s for its eighth, its CPU
growing alike (in librdkafka's threads); 1,024 partitions a read: 30 ms, then 85 ms by the 12th;
8 partitions: no growth measurable in 400 reads. A new consumer costs ~60 ms (connect, metadata,
first fetch); a retired one is closed in a thread of its own, off the reading task's path: the
same reads then take 0.28-0.44 s a batch, flat, from the first batch to the eighth.
"""

from __future__ import annotations

import atexit
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException

from txn_offsets.config import KafkaSettings
from txn_offsets.kafka.causes import Witness
from txn_offsets.kafka.clients import client_config, settings_key, witness_for

__all__ = ["METADATA_TIMEOUT_S", "RETIRE_AFTER_ASSIGNMENTS", "ConsumerPool", "consumer_config", "pool"]

logger = logging.getLogger(__name__)

#: How long a metadata request for a topic new to a consumer may take before the read goes on
#: without it (the read's own stall timeout still bounds it).
METADATA_TIMEOUT_S = 5.0

#: Partition assignments a pooled consumer serves before it is closed instead of pooled again
#: (see above): the slowdown grows with assignments served times partitions per read, a new
#: consumer costs ~60 ms and closing one more the more it served (2,048 partitions: 0.18 s after
#: one read, ~0.8 s after four): a read of 2,048 partitions gets a new consumer every other read,
#: one of 8 partitions every ~500 reads.
RETIRE_AFTER_ASSIGNMENTS = 4_096


#: What a consumer of :func:`~txn_offsets.kafka.reader.read_ranges` (small ranges, read together)
#: fetches ahead. librdkafka's defaults - 1 MB per partition per fetch, and fetching on until
#: 100,000 records per partition are queued - had a task's 4 ranges of 1,000 records drag many
#: times that past their ends through the broker, librdkafka and Python, all competing for the
#: same cores as the job. The streaming reader keeps the defaults (large ranges need the depth).
SMALL_READS: dict[str, Any] = {"max.partition.fetch.bytes": 262_144, "queued.min.messages": 2_000}


def consumer_config(kafka: KafkaSettings, *, small: bool = False) -> dict[str, Any]:
    """Consumer properties for range reads, `small`: for :data:`SMALL_READS` (the user's settings
    first; ours win)."""
    return {
        # a fetch at the log's end waits on the broker this long for new data, and a pooled
        # consumer cannot start the next range's fetch before it returns: every range that follows
        # one whose prefetch reached its partition's end (in a caught-up job, all) waits for it.
        # Measured per 62-offset range (first record): 10 ms -> 10.6 ms, 2 ms -> 2.5 ms, 0 -> 0.5 ms;
        # but 0 (and at times 1) spins fetches at the log end while a range is decoded, doubling
        # the CPU per record of a large range. The default is 500 ms. The user's setting wins.
        "fetch.wait.max.ms": 2,
        # a consumer fetches ahead up to queued.min.messages (100,000 per partition) and, that
        # reached, postpones the partition's next fetch by this long (librdkafka's default: 1,000
        # ms); a range needs far fewer, and the pooled consumer's next range (the same partition,
        # further on) waited out the postponement: ~1.1 s batches, 2-4 in every 50 of 8,000
        # records (8 partitions); 10 ms: none, 56,000 instead of 43,000 records/s. The user's wins.
        "fetch.queue.backoff.ms": 10,
        **(SMALL_READS if small else {}),
        **kafka.client_config(),  # secrets in clear (Secret values unwrapped)
        "bootstrap.servers": kafka.bootstrap_servers,
        # librdkafka requires a group id even for assign(); nothing is ever committed to it
        "group.id": kafka.extra.get("group.id", f"txn-offsets-reader-{uuid.uuid4().hex[:8]}"),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # a start outside the log is an error, never a silent jump to earliest/latest
        "auto.offset.reset": "error",
        "isolation.level": kafka.isolation_level,
        # an event at the end of the partition: a range ending there (every range of a caught-up
        # job) finishes as soon as the end is reached instead of waiting out a poll timeout
        "enable.partition.eof": True,
    }


class ConsumerPool:
    """One idle Consumer per Kafka settings in this process, with the topics it has metadata for.
    A consumer whose read did not finish cleanly is discarded (closed), never reused."""

    def __init__(self) -> None:
        self._idle: dict[str, Consumer] = {}
        # keyed by the consumer itself, never id(consumer): an id is reused once its object is
        # freed, and an entry of a consumer gone without _forget (one closed by its holder) counted
        # its assignments for the next consumer at that address (retired a read early)
        self._known: dict[Consumer, set[str]] = {}  # consumer -> topics it has metadata for
        self._witnesses: dict[Consumer, Witness] = {}  # consumer -> its failed connections
        self._served: dict[Consumer, int] = {}  # consumer -> partition assignments it served
        self._lock = threading.Lock()

    def take(self, kafka: KafkaSettings, topics: Iterable[str] = (), *, small: bool = False) -> Consumer:
        """An idle consumer (or a new one) with metadata for each of `topics`, to assign them;
        `small`: one for small ranges (:data:`SMALL_READS`)."""
        with self._lock:
            consumer = self._idle.pop(settings_key(kafka, small), None)
        if consumer is None:
            config = consumer_config(kafka, small=small)
            witness = witness_for(config)
            consumer = Consumer(client_config(config, witness))
            with self._lock:
                self._witnesses[consumer] = witness
        with self._lock:
            known = self._known.setdefault(consumer, set())
        for topic in sorted(set(topics) - known):
            try:
                found = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
            except KafkaException as exc:  # the read itself waits for it, or fails clearly
                logger.debug("no metadata for topic %r yet: %s", topic, exc)
                continue
            if found is not None and found.error is None:  # else asked again next time
                known.add(topic)
        return consumer

    def known_topics(self, consumer: Consumer) -> frozenset[str]:
        """The topics `consumer` (one this pool handed out) has metadata for."""
        with self._lock:
            return frozenset(self._known.get(consumer, ()))

    def failures(self, consumer: Consumer, within_s: float) -> str:
        """Why `consumer` (one this pool handed out) could not talk to its brokers in the last
        `within_s` seconds, as librdkafka told (:mod:`txn_offsets.kafka.causes`); "" if it did not."""
        with self._lock:
            witness = self._witnesses.get(consumer)
        return "" if witness is None else witness.said(within_s)

    def give_back(
        self, kafka: KafkaSettings, consumer: Consumer, *, assigned: int, small: bool = False
    ) -> None:
        """`consumer` read cleanly with `assigned` partitions assigned: pooled again, or closed once
        it served :data:`RETIRE_AFTER_ASSIGNMENTS` partition assignments."""
        consumer.unassign()
        with self._lock:
            served = self._served[consumer] = self._served.get(consumer, 0) + assigned
        if served >= RETIRE_AFTER_ASSIGNMENTS:
            self._forget(consumer)
            # closing it takes ~0.2-0.4 s of librdkafka's time (more the more it served): not
            # the reading task's (the close joins the interpreter's exit like any thread)
            threading.Thread(target=_close, args=(consumer,), name="txn-offsets-retired-consumer").start()
            return
        with self._lock:
            old = self._idle.pop(settings_key(kafka, small), None)
            self._idle[settings_key(kafka, small)] = consumer
        if old is not None:
            self.discard(old)

    def discard(self, consumer: Consumer) -> None:
        """Close `consumer` and forget it (its state is unknown, or it is one too many)."""
        self._forget(consumer)
        consumer.close()

    def _forget(self, consumer: Consumer) -> None:
        with self._lock:
            self._known.pop(consumer, None)
            self._witnesses.pop(consumer, None)
            self._served.pop(consumer, None)

    def close_all(self) -> None:
        with self._lock:
            idle = list(self._idle.values())
            self._idle.clear()
        for consumer in idle:
            self.discard(consumer)


def _close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as exc:  # it read cleanly before: nothing of a read depends on its close
        logger.debug("closing a retired consumer failed: %s", type(exc).__name__)


pool = ConsumerPool()
atexit.register(pool.close_all)
