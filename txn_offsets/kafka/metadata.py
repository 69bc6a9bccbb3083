"""Driver-side Kafka metadata: partitions of topics, watermarks (at the readers' isolation level),
offsets for a timestamp. Every call is bounded by a timeout and fails with one of our errors.

The clients come from :mod:`txn_offsets.kafka.admins`, whose first contact is bounded tighter
(bootstrap servers that answer nothing fail within seconds, not after every request's timeout);
a client is retired only when Kafka did not answer. Offsets are asked for only once the offsets
client has looked the partitions' leaders up (:mod:`txn_offsets.kafka.leaders`)."""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import _AdminClientImpl

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, TopicMissing, TxnOffsetsError
from txn_offsets.kafka import described, leaders
from txn_offsets.kafka.admins import (
    NO_ANSWER,
    client_key,
    connected_admin,
    describe_error,
    forget_admin_client,
    issued,
    unreachable,
)
from txn_offsets.kafka.described import TopicInfo
from txn_offsets.ranges import TopicPartition as TP

__all__ = [
    "TopicInfo",
    "describe_topics",
    "offsets_for_time",
    "partitions_for",
    "topics_and_watermarks",
    "topics_matching",
    "unknown_mark",
    "watermarks",
]

logger = logging.getLogger(__name__)
# a ListOffsets answer that means the offsets client's knowledge of the topic is out of date (a
# partition added, a leader moved, the topic gone): it is looked up again next time (leaders.forget_leaders)
_STALE = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._NOENT,  # "Failed to query partition leaders: No leaders found"
}


def _failed(kafka: KafkaSettings, role: str, exc: BaseException, within_s: float) -> TxnOffsetsError:
    """The error for a failed request. When Kafka did not answer, a fresh client next time and the
    error names why (:func:`~txn_offsets.kafka.admins.unreachable`); not for an answer (no leader
    for a topic being re-created, say): the cached client is fine, and retiring clients for answers
    made one per plan while a topic was re-created."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError) or err.code() in NO_ANSWER:
        return unreachable(kafka, role, within_s, describe_error(exc))
    return ServiceUnavailable("Kafka", kafka.bootstrap_servers, describe_error(exc))


def _topics_metadata(kafka: KafkaSettings, timeout_s: float, topic: str | None = None) -> Any:
    try:
        return connected_admin(kafka, timeout_s).list_topics(topic=topic, timeout=timeout_s)
    except KafkaException as exc:
        raise _failed(kafka, "metadata", exc, timeout_s + 1) from None


def partitions_for(kafka: KafkaSettings, topic: str, *, timeout_s: float = 10.0) -> list[int]:
    """The partition ids of `topic`; a missing topic is a ConfigError that names it."""
    meta = _topics_metadata(kafka, timeout_s, topic)
    info = meta.topics.get(topic)
    if info is None or info.error is not None:
        code = info.error.code() if info is not None and info.error is not None else None
        if code in (None, KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise ConfigError("topics", f"topic {topic!r} does not exist on {kafka.bootstrap_servers}")
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"metadata for {topic!r}: {info.error}")
    return sorted(info.partitions)


def _result(
    kafka: KafkaSettings,
    fut: Future[Any],
    timeout_s: float,
    what: str,
    topic: str,
    *,
    role: str = "metadata",
    stale: Callable[[], None] | None = None,
) -> Any:
    """One admin future's answer: an unknown topic or partition is a ConfigError naming `what`;
    anything else that fails, or no answer in time, is ServiceUnavailable (and the cached client is
    retired if Kafka did not answer)."""
    try:
        return fut.result(timeout=timeout_s + 5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if stale is not None and isinstance(err, KafkaError) and err.code() in _STALE:
            stale()
        if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise TopicMissing(topic, f"{what} does not exist on {kafka.bootstrap_servers}") from None
        raise _failed(kafka, role, exc, timeout_s + 6) from None
    except TimeoutError:
        raise unreachable(kafka, role, timeout_s + 6, f"no answer about {what} in {timeout_s}s") from None


def describe_topics(
    kafka: KafkaSettings, topics: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, TopicInfo]:
    """Id and partitions of each topic in one round trip; a missing topic is a ConfigError."""
    return _describing(kafka, topics, timeout_s)()


def _describing(
    kafka: KafkaSettings, topics: Sequence[str], timeout_s: float
) -> Callable[[], dict[str, TopicInfo]]:
    """Ask Kafka to describe `topics` now; the function returned waits for the answer."""
    futures: dict[str, Future[Any]] = {}
    if topics:
        admin = connected_admin(kafka, timeout_s)
        futures = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
        issued(admin, futures.values())

    def answer() -> dict[str, TopicInfo]:
        out: dict[str, TopicInfo] = {}
        for topic, fut in futures.items():
            desc = _result(kafka, fut, timeout_s, f"topic {topic!r}", topic)
            out[topic] = TopicInfo(topic, str(desc.topic_id), tuple(sorted(p.id for p in desc.partitions)))
        described.remember(client_key(kafka), out.values())
        return out

    return answer


def topics_and_watermarks(
    kafka: KafkaSettings, topics: Sequence[str], *, timeout_s: float = 10.0, reuse_within_s: float = 0.0
) -> tuple[dict[str, TopicInfo], dict[TP, tuple[int, int]]]:
    """:func:`describe_topics` and :func:`watermarks` in one wait: the partitions last seen (the previous
    plan) are asked for while the topics are described; only new ones after.

    Past one request's worth of partitions (:data:`LIST_OFFSETS_CHUNK`) they are asked one after the
    other instead: the two answers then cost more to take in than the round trip saved (4,096
    partitions: ~165-190 ms one after the other, ~185-210 ms together; 8: ~2.3 vs ~2.0 ms). There,
    with `reuse_within_s`, topics described that recently are not described again (``described=False``
    in their TopicInfo; :mod:`.described`): a partition added since is seen within that time."""
    key = client_key(kafka)
    guess = described.partitions_seen(key, topics)
    known = described.recent(key, topics, reuse_within_s) if len(guess) > LIST_OFFSETS_CHUNK else None
    if known is not None:
        try:
            return known, watermarks(kafka, guess, timeout_s=timeout_s)
        except TopicMissing:  # gone, or re-created with fewer partitions: what does Kafka say now?
            described.forget_descriptions(topics)
        except ServiceUnavailable:  # no answer (asked again on a fresh client), or no leader yet
            described.forget_descriptions(topics)
            raise
    asked = _describing(kafka, topics, timeout_s)
    marks: dict[TP, tuple[int, int]] = {}
    if len(guess) <= LIST_OFFSETS_CHUNK:
        try:
            marks = watermarks(kafka, guess, timeout_s=timeout_s)
        except (TopicMissing, ServiceUnavailable):  # a guess: gone, or re-created ("No leaders found")
            marks = {}
    out = asked()
    parts = [(t, p) for t in topics for p in out[t].partitions]
    new = [tp for tp in parts if tp not in marks]
    if new:
        marks.update(watermarks(kafka, new, timeout_s=timeout_s))
    return out, {tp: marks[tp] for tp in parts}


def topics_matching(kafka: KafkaSettings, pattern: str, *, timeout_s: float = 10.0) -> list[str]:
    """Topics whose whole name matches the regex `pattern` (internal topics excluded)."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ConfigError("topic_pattern", f"{pattern!r} is not a valid regular expression: {exc}") from None
    meta = _topics_metadata(kafka, timeout_s)
    return sorted(t for t in meta.topics if not t.startswith("_") and regex.fullmatch(t))


# per ListOffsets request: 4,096 partitions in one took ~0.5 s on the 2-core box, 8 x 512 ~0.07 s
LIST_OFFSETS_CHUNK = 512


def _ask(
    admin: AdminClient, key: str, tps: list[TopicPartition], level: IsolationLevel, timeout_s: float
) -> Future[Any]:
    """One ListOffsets request (each TopicPartition's offset: its OffsetSpec) answered by ONE future,
    not one per partition as AdminClient.list_offsets makes (~0.1 s per 4,096). Its partitions'
    leaders must have been looked up (:func:`leaders.ensure`)."""
    fut: Future[Any] = Future()
    fut.set_running_or_notify_cancel()
    with leaders.asking(key, admin):
        _AdminClientImpl.list_offsets(
            admin, tps, fut, isolation_level_value=level.value, request_timeout=timeout_s
        )
        issued(admin, [fut])
    return fut


_EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
# NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE, UNKNOWN/FENCED_LEADER_EPOCH (make test, once): the
# leader is not serving yet (a topic just created: its metadata names it a moment before it answers as
# one) or has moved (a rolling restart). Asked again, on a fresh offsets client, every LEADER_WAIT_S.
_MOVING = ("LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH")
_LEADER_MOVING = {getattr(KafkaError, name) for name in _MOVING}
LEADER_WAIT_S = 0.5


def unknown_mark(spec: object, offset: int) -> bool:
    """True when a ListOffsets answer holds no offset: negative for a log start or end (which
    never are); a timestamp's -1 is an answer (no record at or after it: the end is asked next)."""
    return offset < 0 if spec is _EARLIEST or spec is _LATEST else offset < -1


class _LeaderMoving(Exception):
    def __init__(self, said: str, asked: Sequence[Future[Any]]) -> None:
        super().__init__(said)
        self.asked = asked  # every request of the attempt: waited for before anything is asked again


def _list_offsets(
    kafka: KafkaSettings, parts: Sequence[TP], *specs: OffsetSpec, timeout_s: float
) -> list[dict[TP, int]]:
    """The offset of every partition in `parts` at each of `specs`, all asked for before waiting for
    any (one broker round trip per chunk of :data:`LIST_OFFSETS_CHUNK` partitions, all in flight
    together).

    A partition whose broker does not lead it (yet) is asked again until `timeout_s` (36 of 40
    watermarks asked straight after create_topics failed so on the stack). First every request of
    the attempt is answered and the offsets client retired: the next attempt starts as every first
    call does, on a fresh client that looks the leaders up before asking (:mod:`.leaders`)."""
    deadline = time.monotonic() + timeout_s
    values = [int(spec._value) for spec in specs]
    while True:
        try:
            return _list_offsets_once(kafka, parts, values, max(0.1, deadline - time.monotonic()))
        except _LeaderMoving as exc:
            _, unanswered = wait_all(exc.asked, timeout=max(0.0, deadline - time.monotonic()))
            if unanswered or time.monotonic() + LEADER_WAIT_S > deadline:
                raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, str(exc)) from None
            forget_admin_client(kafka, roles=("offsets",))
            time.sleep(LEADER_WAIT_S)


def _list_offsets_once(
    kafka: KafkaSettings, parts: Sequence[TP], values: Sequence[int], timeout_s: float
) -> list[dict[TP, int]]:
    # AdminClient.list_offsets defaults to read_uncommitted: always pass the readers' level, or the
    # planner could hand out ranges past the LSO that read_committed readers can never finish.
    level = (
        IsolationLevel.READ_COMMITTED
        if kafka.isolation_level == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    admin = connected_admin(kafka, timeout_s, "offsets")  # never the describing client (admins)
    key = client_key(kafka, "offsets")
    leaders.ensure(kafka, key, admin, parts, timeout_s)
    chunks = [parts[i : i + LIST_OFFSETS_CHUNK] for i in range(0, len(parts), LIST_OFFSETS_CHUNK)]
    asked: list[list[tuple[Future[Any], str]]] = []
    for value in values:  # each TopicPartition's offset is the OffsetSpec's value (-2 earliest, ...)
        requests = ([TopicPartition(t, p, value) for t, p in chunk] for chunk in chunks)
        asked.append([(_ask(admin, key, tps, level, timeout_s), tps[0].topic) for tps in requests])
    answers: list[dict[TP, int]] = []
    for value, futures in zip(values, asked, strict=True):
        out: dict[TP, int] = {}
        for fut, topic in futures:
            refresh = functools.partial(leaders.forget_leaders, key, topic)
            what = f"the offsets of {topic!r}"
            answer = _result(kafka, fut, timeout_s, what, topic, role="offsets", stale=refresh)
            for tp, info in answer.items():
                if isinstance(info, KafkaError):  # as _result reports a failed future
                    what = f"{tp.topic}[{tp.partition}]"
                    if info.code() in _STALE:
                        refresh()
                    if info.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise TopicMissing(tp.topic, f"{what} does not exist on {kafka.bootstrap_servers}")
                    if info.code() in _LEADER_MOVING:
                        raise _LeaderMoving(f"{what}: {info.name()}", [f for each in asked for f, _ in each])
                    if info.code() in NO_ANSWER:
                        forget_admin_client(kafka)
                    raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"{what}: {info.name()}")
                if unknown_mark(value, info.offset):
                    # a log start or end is never negative: the partition's leader just died and
                    # the broker answering has no log for it yet (librdkafka's -1001, seen on the
                    # lab's three brokers): a moving leader, asked again - never taken as the end
                    what = f"{tp.topic}[{tp.partition}]"
                    raise _LeaderMoving(
                        f"{what}: no offset in the answer", [f for each in asked for f, _ in each]
                    )
                out[(tp.topic, tp.partition)] = info.offset
        answers.append(out)
    return answers


def watermarks(
    kafka: KafkaSettings, partitions: Iterable[TP], *, timeout_s: float = 10.0
) -> dict[TP, tuple[int, int]]:
    """(log start, end) per partition; the end is the LSO under read_committed, the high watermark
    under read_uncommitted (the same level the readers use)."""
    parts = sorted(set(partitions))
    low, high = _list_offsets(kafka, parts, _EARLIEST, _LATEST, timeout_s=timeout_s)
    return {key: (low[key], high[key]) for key in parts}


def offsets_for_time(
    kafka: KafkaSettings, partitions: Iterable[TP], timestamp_ms: int, *, timeout_s: float = 10.0
) -> dict[TP, int]:
    """Per partition, the first offset whose timestamp is >= `timestamp_ms`, or the end offset if
    there is none (so a start "at a time in the future" reads only what arrives later)."""
    if timestamp_ms < 0:
        raise ConfigError("timestamp", f"must be >= 0 milliseconds since the epoch, got {timestamp_ms}")
    parts = sorted(set(partitions))
    spec: OffsetSpec = OffsetSpec.for_timestamp(timestamp_ms)
    (found,) = _list_offsets(kafka, parts, spec, timeout_s=timeout_s)
    missing = [key for key in parts if found[key] < 0]
    ends = watermarks(kafka, missing, timeout_s=timeout_s) if missing else {}
    return {key: (ends[key][1] if key in ends else found[key]) for key in parts}
