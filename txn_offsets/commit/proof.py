"""The topic-incarnation proof: the records a unit read came from the topic its ranges were planned from.

A topic deleted and created again under the same name hands a reader the NEW topic's records at
the planned offsets. Topic ids are never reused, so asking Kafka for each topic's id AFTER the read
and finding the planned id proves every record read came from the planned incarnation; any other
answer (another id, no topic) means the records cannot be trusted and nothing may be committed.
"Kafka" is every broker this process reaches, each asked its own view on a connection kept for
the next proof (:func:`txn_offsets.kafka.recreated.brokers`): a broker cut off from the
controllers still holds a deleted topic's log and its id, and serves that log's records to a
reader whose librdkafka took the old id from it, while any other broker describes the new id
(docs/reliability.md, a re-created topic led by a lagging broker). With settings the direct
client cannot speak (GSSAPI, OAUTHBEARER, ``ssl.keystore.*``), or when no broker answers it, one
librdkafka description (any one broker) is the proof, as before.

The proof is required: every unit names where its records were read (:data:`Source`). A caller
that owns no Kafka source (its records came from elsewhere, a test that writes no records) says so
with a :class:`NoKafkaSource` and a reason. The commit shell starts the proof once the units are
handed to it (after their reads), lets Kafka answer while it claims and writes, and awaits it
before COMMIT (:mod:`txn_offsets.commit.shell`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, TopicChanged, TopicMissing
from txn_offsets.kafka import direct, recreated
from txn_offsets.kafka.metadata import describe_topics
from txn_offsets.ranges import OffsetRange

__all__ = ["NoKafkaSource", "Proof", "Source", "check_incarnation", "start_proofs"]


@dataclass(frozen=True)
class NoKafkaSource:
    """The caller read no Kafka records for its ranges (so there is no incarnation to prove): why."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ConfigError("source", "NoKafkaSource needs a reason: say why no Kafka records were read")


#: where a unit's records were read: the Kafka cluster, or an explicit NoKafkaSource
Source = KafkaSettings | NoKafkaSource


def check_incarnation(
    kafka: KafkaSettings, ranges: Iterable[OffsetRange], *, timeout_s: float = 10.0
) -> None:
    """Raise TopicChanged unless every topic of `ranges` still has the Kafka topic id its ranges
    were planned from (ranges without a topic id are not checked). One request for all topics to
    each broker (requests sent at once), or one librdkafka description (see the module)."""
    planned: dict[str, set[str]] = {}  # each range's own id (ranges of several plans may differ)
    for rng in ranges:
        if rng.topic_id is not None:
            planned.setdefault(rng.topic, set()).add(rng.topic_id)
    if not planned:
        return
    if _every_broker(kafka, planned, timeout_s):
        return
    try:
        infos = describe_topics(kafka, sorted(planned), timeout_s=timeout_s)
    except TopicMissing as exc:
        raise TopicChanged(exc.topic, min(planned[exc.topic]), None) from None
    for topic, topic_ids in sorted(planned.items()):
        for topic_id in sorted(topic_ids):
            if infos[topic].topic_id != topic_id:
                raise TopicChanged(topic, topic_id, infos[topic].topic_id)


def _every_broker(kafka: KafkaSettings, planned: dict[str, set[str]], timeout_s: float) -> bool:
    """True when every broker that answered names each planned id (TopicChanged when one names
    another id, or none has the topic); False when this cannot be asked (no broker answered, or
    settings the direct client lacks): the caller describes the topics through librdkafka."""
    try:
        views = recreated.brokers(kafka).views(sorted(planned), timeout_s)
    except direct.Unsupported as exc:
        recreated.unsupported(exc, "the topic-incarnation proof asks one broker (librdkafka)")
        return False
    if all(v is None for by_topic in views.values() for v in by_topic.values()):
        return False
    for topic, topic_ids in sorted(planned.items()):
        for topic_id in sorted(topic_ids):
            found = recreated.contradiction({b: v[topic] for b, v in views.items()}, topic_id)
            if found is not None:
                raise TopicChanged(topic, topic_id, found[1])
    return True


_POOLS: dict[int, ThreadPoolExecutor] = {}  # one per (forked) process: Spark forks its Python workers


def _pool() -> ThreadPoolExecutor:
    pid = os.getpid()
    return _POOLS.get(pid) or _POOLS.setdefault(pid, ThreadPoolExecutor(2, thread_name_prefix="txn-proof"))


class Proof:
    """The proofs of some units' ranges, asked of Kafka in the background: one proof per cluster."""

    def __init__(self, asks: Sequence[tuple[KafkaSettings, list[OffsetRange]]]) -> None:
        self._futures: list[Future[None]] = [_pool().submit(check_incarnation, k, r) for k, r in asks]

    def wait(self) -> None:
        """Return once every topic was proven the planned incarnation; TopicChanged (or Kafka's
        error) otherwise. Called before COMMIT, never after."""
        for future in self._futures:
            future.result()


def start_proofs(units: Sequence[tuple[Source, Sequence[OffsetRange]]]) -> Proof:
    """Start proving the ranges of every (source, ranges) pair: the ranges of one cluster in one request."""
    by_cluster: dict[KafkaSettings, list[OffsetRange]] = {}
    for source, ranges in units:
        if isinstance(source, NoKafkaSource):
            continue
        if not isinstance(source, KafkaSettings):
            raise ConfigError(
                "source",
                f"expected the KafkaSettings the records were read with, or NoKafkaSource(reason); "
                f"got {type(source).__name__}",
            )
        if any(r.topic_id is not None for r in ranges):
            by_cluster.setdefault(source, []).extend(ranges)
    return Proof(list(by_cluster.items()))
