"""Wide, small reads with Kafka's own Fetch: the records of many small ranges in one request per
leader, their batches decoded here (:mod:`txn_offsets.kafka.batches`), no librdkafka assignment.

Why: librdkafka's work for a read grows with the partitions assigned, whatever they hold - its
broker thread walks every assigned partition each time it wakes. A read of 2,048 ranges of 2
records cost ~0.3 CPU-s of librdkafka's threads (docs/benchmarks.md, "Sixth pass"): at 4,096
partitions a batch's reads took more CPU than the rest of the batch. One Fetch (v13, the topic named
by the range's planned *id*) asks each leader for all of its partitions at their positions.

Only what is read plainly is read here; the rest of a range goes to librdkafka from where this read
reached it (:func:`read_wide` returns it, :func:`txn_offsets.kafka.reader.read_ranges` reads it): a
partition whose answer is an error (a leader moved, a start no longer in the log, a leader that does
not hold the planned topic id), that holds a batch of an older magic or one that does not
decompress (:mod:`txn_offsets.kafka.batches` decodes every codec), or that did not move in a
round where no partition moved; all of them when the client's settings name what
:mod:`txn_offsets.kafka.direct` cannot do (GSSAPI, OAUTHBEARER, ...) or a broker does not answer.
Records are never decided differently, only by whom they are read: a position is always the
offset after a record delivered or after a whole batch, where librdkafka starts as well.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import direct
from txn_offsets.kafka.batches import Undecodable, read_batches
from txn_offsets.kafka.clients import settings_key
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.ranges import TopicPartition as TP

__all__ = ["read_wide"]

logger = logging.getLogger(__name__)

#: a Fetch's byte limits. Per partition: what a range's span asks for at first (BYTES_PER_OFFSET an
#: offset, between the two bounds: a range of 2 records does not drag 256 kB of the log past it
#: through the broker and this process), doubled for a partition that did not move though its log
#: goes on (:func:`_held_back`; up to PARTITION_MAX_BYTES_CAP). Per answer: partitions past it get
#: nothing and are asked again.
BYTES_PER_OFFSET = 512
PARTITION_MIN_BYTES = 16_384
PARTITION_MAX_BYTES = 262_144
PARTITION_MAX_BYTES_CAP = 8 * 1024 * 1024
MAX_BYTES = 16 * 1024 * 1024
#: how long a connection, a metadata request or a Fetch may take before the read goes to librdkafka
TIMEOUT_S = 10.0
#: a connection idle this long is closed rather than used (a broker closes idle ones after
#: connections.max.idle.ms, 9 minutes by default: a Fetch on one would fail the read over to
#: librdkafka)
IDLE_S = 60.0
#: after a read that failed (a broker gone, an answer not understood), the reads of the same
#: settings go to librdkafka this long: a broker that cannot answer is not asked on every read
REST_S = 30.0


@dataclass
class _Cluster:
    """What this process knows of one Kafka (by client settings): brokers, topics' leaders, and one
    idle connection per broker."""

    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    topics: dict[str, direct.Topic] = field(default_factory=dict)
    idle: dict[int, direct.Connection] = field(default_factory=dict)
    used_at: float = 0.0  # when its connections were last used (monotonic)


_clusters: dict[str, _Cluster] = {}
_resting: dict[str, float] = {}  # settings -> until when their reads go to librdkafka (monotonic)
_lock = threading.Lock()


def read_wide(
    kafka: KafkaSettings, ranges: Sequence[OffsetRange]
) -> tuple[dict[TP, list[Record]], list[OffsetRange]]:
    """The records read here of each of `ranges` (one per partition), by (topic,
    partition), and what is left for librdkafka: each unfinished range from where it was reached."""
    config = kafka.client_config()
    try:
        direct.check_settings(config)
    except direct.Unsupported:
        return {}, list(ranges)
    out: dict[TP, list[Record]] = {r.key: [] for r in ranges}
    position = {r.key: r.start for r in ranges}
    todo = {r.key: r for r in ranges if not r.empty}
    left: list[OffsetRange] = []
    key = settings_key(kafka)
    with _lock:
        if _resting.get(key, 0.0) > time.monotonic():
            return {}, list(ranges)
        cluster = _clusters.pop(key, None) or _Cluster()
    if time.monotonic() - cluster.used_at > IDLE_S:
        _close(cluster)
    isolation = direct.isolation(kafka.isolation_level)
    limit = {tp: _first_limit(rng) for tp, rng in todo.items()}
    clean = False
    try:
        while todo:
            _know(cluster, config, kafka.bootstrap_servers, {t for t, _ in todo})
            left += [
                _rest(todo.pop(tp), position[tp]) for tp in [tp for tp in todo if not _leader(cluster, tp)]
            ]
            asked = _ask(cluster, config, todo, (position, limit), isolation)
            moved = grew = False
            for (topic, broker, parts), correlation in asked.items():
                answers = direct.fetch_answer(cluster.idle[broker], correlation, parts)
                for part, answer in answers.items():
                    tp = (topic, part)
                    rng = todo.get(tp)
                    if rng is None:  # not asked for: nothing of it is read
                        continue
                    before = position[tp]
                    reached = _decoded(answer, rng, before, isolation, out[tp])
                    if reached is None:  # not for this read: librdkafka reads the rest
                        left.append(_rest(rng, before))
                        del todo[tp]
                        if answer.error:  # a leader moved, say: the next read asks again
                            cluster.topics.pop(topic, None)
                        continue
                    position[tp] = reached
                    moved = moved or reached > before
                    if reached >= rng.until:
                        del todo[tp]
                    elif (
                        reached == before
                        and limit[tp] < PARTITION_MAX_BYTES_CAP
                        and _held_back(answer, before, isolation)
                    ):
                        limit[tp] *= 2  # more room next round
                        grew = True
            if not moved and not grew:
                left += [_rest(rng, position[tp]) for tp, rng in todo.items()]
                todo.clear()
        clean = True
    except (OSError, ValueError, IndexError, struct.error) as exc:  # a broker gone, an answer cut short
        logger.info("wide reads go to librdkafka for %.0f s: %s", REST_S, type(exc).__name__)
        left += [_rest(rng, position[tp]) for tp, rng in todo.items()]
        with _lock:
            _resting[key] = time.monotonic() + REST_S
    finally:
        if clean:
            cluster.used_at = time.monotonic()
            with _lock:
                old = _clusters.pop(key, None)
                _clusters[key] = cluster
            if old is not None:
                _close(old)
        else:
            _close(cluster)
    return out, left


def _know(cluster: _Cluster, config: dict[str, object], bootstrap: str, topics: set[str]) -> None:
    """Fill in `cluster`'s brokers and the metadata of `topics` it does not have."""
    missing = sorted(topics - set(cluster.topics))
    if not missing:
        return
    if cluster.idle:
        answer = direct.metadata(next(iter(cluster.idle.values())), missing)
    else:
        answer = _bootstrap_metadata(config, bootstrap, missing)
    cluster.brokers.update(answer.brokers)
    for name, topic in answer.topics.items():
        if topic.error == 0:
            cluster.topics[name] = topic


def _bootstrap_metadata(config: dict[str, object], bootstrap: str, topics: list[str]) -> direct.Cluster:
    """The metadata of `topics` from the first of the bootstrap servers that answers."""
    failed: OSError | None = None
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with direct.connect(config, host.strip("[]"), int(port), TIMEOUT_S) as conn:
                return direct.metadata(conn, topics)
        except OSError as exc:
            failed = exc
    raise failed or OSError("no bootstrap server")


def _leader(cluster: _Cluster, tp: TP) -> tuple[int, int] | None:
    """(leader, leader epoch) of `tp` as `cluster` knows it, None if not."""
    topic = cluster.topics.get(tp[0])
    part = topic.partitions.get(tp[1]) if topic is not None else None
    if part is None or part.error != 0 or part.leader < 0 or part.leader not in cluster.brokers:
        return None
    return part.leader, part.leader_epoch


def _ask(
    cluster: _Cluster,
    config: dict[str, object],
    todo: dict[TP, OffsetRange],
    at: tuple[dict[TP, int], dict[TP, int]],
    isolation: int,
) -> dict[tuple[str, int, tuple[int, ...]], int]:
    """One Fetch per (topic, leader) for the partitions of `todo` at (their positions, their byte
    limits), sent without waiting: each request's correlation id by (topic, leader, partitions)."""
    position, limit = at
    wanted: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    for tp in todo:
        leader = _leader(cluster, tp)
        if leader is not None:
            wanted.setdefault((tp[0], leader[0]), {})[tp[1]] = (position[tp], leader[1])
    asked: dict[tuple[str, int, tuple[int, ...]], int] = {}
    for (topic, broker), parts in wanted.items():
        conn = cluster.idle.get(broker)
        if conn is None:
            conn = cluster.idle[broker] = direct.connect(config, *cluster.brokers[broker], TIMEOUT_S)
        topic_id = todo[(topic, next(iter(parts)))].topic_id or cluster.topics[topic].topic_id
        correlation = direct.send_fetch(
            conn,
            topic_id,
            parts,
            isolation=isolation,
            max_bytes=MAX_BYTES,
            partition_max_bytes={p: limit[(topic, p)] for p in parts},
        )
        asked[(topic, broker, tuple(parts))] = correlation
    return asked


def _decoded(
    answer: direct.FetchAnswer, rng: OffsetRange, position: int, isolation: int, out: list[Record]
) -> int | None:
    """The position `answer` takes `rng` to from `position`, its records appended to `out` (under
    read_committed those of aborted transactions left out, by the answer's list); None when
    librdkafka is to read it from `position` (an error, a batch not decoded here - whatever it
    appended then is taken back)."""
    if answer.error != 0:
        return None
    had = len(out)
    aborted = answer.aborted if isolation == direct.READ_COMMITTED else None
    try:
        return read_batches(
            answer.records,
            rng.topic,
            rng.partition,
            position=position,
            until=rng.until,
            out=out,
            aborted=aborted,
        )
    except Undecodable as exc:
        logger.debug("%s[%d]: %s", rng.topic, rng.partition, exc)
    except Exception as exc:  # an answer not as Kafka documents it: never a record of it kept
        logger.info("%s[%d]: a Fetch answer not decoded (%s)", rng.topic, rng.partition, type(exc).__name__)
    del out[had:]
    return None


def _held_back(answer: direct.FetchAnswer, position: int, isolation: int) -> bool:
    """Whether a partition that did not move from `position` has records past it that its answer
    did not bring: a batch larger than its byte limit (a broker sends nothing of it then, or the
    batch cut short, unless the partition is the answer's first) or an answer full before it came."""
    return bool(answer.records) or answer.end(read_committed=isolation == direct.READ_COMMITTED) > position


def _first_limit(rng: OffsetRange) -> int:
    return min(PARTITION_MAX_BYTES, max(PARTITION_MIN_BYTES, rng.span * BYTES_PER_OFFSET))


def _rest(rng: OffsetRange, position: int) -> OffsetRange:
    return OffsetRange(rng.topic, rng.partition, position, rng.until, rng.topic_id)


def _close(cluster: _Cluster) -> None:
    for conn in cluster.idle.values():
        with contextlib.suppress(OSError):
            conn.close()
    cluster.idle.clear()
