"""Driver-side Kafka metadata: partitions of topics, watermarks (at the readers' isolation level),
offsets for a timestamp. Every call is bounded by a timeout and fails with one of our errors.

The first call on a new client is bounded tighter (:func:`connected_admin`): bootstrap servers
that answer nothing (a closed port, a listener that never replies) fail within
:data:`FIRST_CONTACT_S` seconds (or the Kafka settings' ``socket.connection.setup.timeout.ms``),
not after every request's own timeout."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import ListOffsetsResultInfo, OffsetSpec
from confluent_kafka.cimpl import _AdminClientImpl

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, TopicChanged, TopicMissing
from txn_offsets.kafka import auth
from txn_offsets.kafka.clients import client_config, serve_logs
from txn_offsets.ranges import OffsetRange
from txn_offsets.ranges import TopicPartition as TP

__all__ = [
    "FIRST_CONTACT_S",
    "TopicInfo",
    "check_incarnation",
    "connected_admin",
    "describe_topics",
    "offsets_for_time",
    "partitions_for",
    "topics_and_watermarks",
    "topics_matching",
    "watermarks",
]

logger = logging.getLogger(__name__)
_admins: dict[str, AdminClient] = {}
_contacted: set[str] = set()  # keys of the cached clients whose bootstrap servers answered
_admins_lock = threading.Lock()
_seen: dict[tuple[str, str], tuple[int, ...]] = {}  # (client key, topic) -> its partitions, last described

FIRST_CONTACT_S = 4.0
# the errors of a first contact that mean nobody answered (any other error is an answer)
_NO_ANSWER = {
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
}


def _key(kafka: KafkaSettings) -> str:
    return repr((kafka.bootstrap_servers, sorted(kafka.client_config().items())))  # passwords too


def forget_admin_client(kafka: KafkaSettings) -> None:
    """Drop the cached client after Kafka was unreachable: a client kept for an address that does
    not answer reconnects (and logs) forever; the next call makes a fresh one."""
    with _admins_lock:
        admin = _admins.pop(_key(kafka), None)
        _contacted.discard(_key(kafka))
    if admin is not None:
        serve_logs(admin)  # its lines say why (refused, TLS, SASL): logged once, de-duplicated


def admin_client(kafka: KafkaSettings) -> AdminClient:
    """One AdminClient per Kafka settings in this process: a plan makes three metadata calls, and a
    new client per call costs a connection and a bootstrap round trip each time (and stalls of a
    second or more on a busy machine). AdminClient is thread-safe."""
    key = _key(kafka)
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            config = {**kafka.client_config(), "error_cb": auth.error_cb(key)}  # SASL/TLS refusals
            admin = _admins[key] = AdminClient(client_config(config))
    serve_logs(admin)
    return admin


def first_contact_s(kafka: KafkaSettings) -> float:
    """How long a new client waits for the bootstrap servers' first answer."""
    setup_ms = kafka.extra.get("socket.connection.setup.timeout.ms")
    return FIRST_CONTACT_S if setup_ms is None else float(setup_ms) / 1000.0


def connected_admin(kafka: KafkaSettings, timeout_s: float) -> AdminClient:
    """The cached client, after its bootstrap servers answered once: the first call on a new
    client asks for the cluster's brokers bounded by :func:`first_contact_s` (at most
    `timeout_s`), so a Kafka that answers nothing is ServiceUnavailable in seconds."""
    admin = admin_client(kafka)
    if _key(kafka) in _contacted:
        return admin
    bound = max(0.1, min(timeout_s, first_contact_s(kafka)))
    try:
        admin.describe_cluster(request_timeout=bound).result(timeout=bound + 0.5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.code() in _NO_ANSWER:
            forget_admin_client(kafka)
            auth.raise_if_refused(kafka, _key(kafka))  # a refused login or certificate: named
            said = (
                "" if isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT else _describe(exc)
            )
            detail = f"no answer in {bound:g}s" + (f" ({said})" if said else "")
            raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, detail) from None
    except TimeoutError:
        forget_admin_client(kafka)
        auth.raise_if_refused(kafka, _key(kafka))
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"no answer in {bound:g}s") from None
    with _admins_lock:
        if _admins.get(_key(kafka)) is admin:
            _contacted.add(_key(kafka))
    return admin


def _topics_metadata(kafka: KafkaSettings, timeout_s: float, topic: str | None = None) -> Any:
    try:
        return connected_admin(kafka, timeout_s).list_topics(topic=topic, timeout=timeout_s)
    except KafkaException as exc:
        forget_admin_client(kafka)
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, _describe(exc)) from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err: KafkaError = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def partitions_for(kafka: KafkaSettings, topic: str, *, timeout_s: float = 10.0) -> list[int]:
    """The partition ids of `topic`; a missing topic is a ConfigError that names it."""
    meta = _topics_metadata(kafka, timeout_s, topic)
    info = meta.topics.get(topic)
    if info is None or info.error is not None:
        code = info.error.code() if info is not None and info.error is not None else None
        if code in (None, KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise ConfigError("topics", f"topic {topic!r} does not exist on {kafka.bootstrap_servers}")
        forget_admin_client(kafka)
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"metadata for {topic!r}: {info.error}")
    return sorted(info.partitions)


@dataclass(frozen=True)
class TopicInfo:
    """One topic as Kafka describes it now: its id (a new one each time the topic is created under
    this name) and its partition ids."""

    name: str
    topic_id: str
    partitions: tuple[int, ...]


def _result(kafka: KafkaSettings, fut: Future[Any], timeout_s: float, what: str, topic: str) -> Any:
    """One admin future's answer: an unknown topic or partition is a ConfigError naming `what`;
    anything else that fails, or no answer in time, is ServiceUnavailable (and the cached client is
    dropped)."""
    try:
        return fut.result(timeout=timeout_s + 5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise TopicMissing(topic, f"{what} does not exist on {kafka.bootstrap_servers}") from None
        forget_admin_client(kafka)
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, _describe(exc)) from None
    except TimeoutError:
        forget_admin_client(kafka)
        raise ServiceUnavailable(
            "Kafka", kafka.bootstrap_servers, f"no answer about {what} in {timeout_s}s"
        ) from None


def describe_topics(
    kafka: KafkaSettings, topics: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, TopicInfo]:
    """Id and partitions of each topic in one round trip; a missing topic is a ConfigError."""
    return _describing(kafka, topics, timeout_s)()


def _describing(
    kafka: KafkaSettings, topics: Sequence[str], timeout_s: float
) -> Callable[[], dict[str, TopicInfo]]:
    """Ask Kafka to describe `topics` now; the function returned waits for the answer."""
    admin = connected_admin(kafka, timeout_s) if topics else None  # referenced until answered
    asked = TopicCollection(list(topics))  # (an AdminClient is falsy: len() of its queue)
    futures = {} if admin is None else admin.describe_topics(asked, request_timeout=timeout_s)

    def answer() -> dict[str, TopicInfo]:
        out: dict[str, TopicInfo] = {}
        for topic, fut in futures.items():
            desc = _result(kafka, fut, timeout_s, f"topic {topic!r}", topic)
            out[topic] = TopicInfo(topic, str(desc.topic_id), tuple(sorted(p.id for p in desc.partitions)))
        with _admins_lock:
            _seen.update({(_key(kafka), topic): info.partitions for topic, info in out.items()})
        return out

    return answer


def topics_and_watermarks(
    kafka: KafkaSettings, topics: Sequence[str], *, timeout_s: float = 10.0
) -> tuple[dict[str, TopicInfo], dict[TP, tuple[int, int]]]:
    """:func:`describe_topics` and :func:`watermarks` in one wait: the partitions last seen (the previous
    plan) are asked for while the topics are described; only new ones after."""
    described = _describing(kafka, topics, timeout_s)
    with _admins_lock:
        guess = [(t, p) for t in topics for p in _seen.get((_key(kafka), t), ())]
    try:
        marks = watermarks(kafka, guess, timeout_s=timeout_s)
    except (TopicMissing, ServiceUnavailable):  # a guess: gone, or re-created ("No leaders found")
        marks = {}
    out = described()
    parts = [(t, p) for t in topics for p in out[t].partitions]
    new = [tp for tp in parts if tp not in marks]
    if new:
        marks.update(watermarks(kafka, new, timeout_s=timeout_s))
    return out, {tp: marks[tp] for tp in parts}


def check_incarnation(
    kafka: KafkaSettings, ranges: Iterable[OffsetRange], *, timeout_s: float = 10.0
) -> None:
    """Raise TopicChanged unless every topic of `ranges` still has the Kafka topic id its ranges
    were planned from (ranges without a topic id are not checked).

    Called AFTER a range's records were read and BEFORE they are committed: a topic deleted and
    re-created under the same name between the plan and the read hands the reader the NEW topic's
    records at the planned offsets. Topic ids are never reused, so the same id after the read
    proves every record read came from the planned incarnation; any other answer (another id, no
    topic) means the records cannot be trusted and nothing may be committed."""
    planned: dict[str, str] = {}
    for rng in ranges:
        if rng.topic_id is not None:
            planned.setdefault(rng.topic, rng.topic_id)
    if not planned:
        return
    try:
        infos = describe_topics(kafka, sorted(planned), timeout_s=timeout_s)
    except TopicMissing as exc:
        raise TopicChanged(exc.topic, planned[exc.topic], None) from None
    for topic, topic_id in sorted(planned.items()):
        if infos[topic].topic_id != topic_id:
            raise TopicChanged(topic, topic_id, infos[topic].topic_id)


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
    admin: AdminClient, tps: list[TopicPartition], level: IsolationLevel, timeout_s: float
) -> Future[Any]:
    """One ListOffsets request (each TopicPartition's offset: its OffsetSpec) answered by ONE future,
    not one per partition as AdminClient.list_offsets makes (~0.1 s per 4,096)."""
    fut: Future[Any] = Future()
    fut.set_running_or_notify_cancel()
    _AdminClientImpl.list_offsets(
        admin, tps, fut, isolation_level_value=level.value, request_timeout=timeout_s
    )
    return fut


def _list_offsets(
    kafka: KafkaSettings, *specs: dict[TopicPartition, OffsetSpec], timeout_s: float
) -> list[dict[TP, ListOffsetsResultInfo]]:
    """The answers to each of `specs`, all asked for before waiting for any (one broker round
    trip per chunk of :data:`LIST_OFFSETS_CHUNK` partitions, all in flight together)."""
    # AdminClient.list_offsets defaults to read_uncommitted: always pass the readers' level, or the
    # planner could hand out ranges past the LSO that read_committed readers can never finish.
    level = (
        IsolationLevel.READ_COMMITTED
        if kafka.isolation_level == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    # keep the client referenced until the futures resolve: a collected client never answers
    admin = connected_admin(kafka, timeout_s)
    asked: list[list[tuple[Future[Any], str]]] = []
    for spec in specs:
        tps = [TopicPartition(tp.topic, tp.partition, int(at._value)) for tp, at in spec.items()]
        chunks = [tps[i : i + LIST_OFFSETS_CHUNK] for i in range(0, len(tps), LIST_OFFSETS_CHUNK)]
        asked.append([(_ask(admin, chunk, level, timeout_s), chunk[0].topic) for chunk in chunks])
    answers: list[dict[TP, ListOffsetsResultInfo]] = []
    for futures in asked:
        out: dict[TP, ListOffsetsResultInfo] = {}
        for fut, topic in futures:
            for tp, info in _result(kafka, fut, timeout_s, f"the offsets of {topic!r}", topic).items():
                if isinstance(info, KafkaError):  # as _result reports a failed future
                    what = f"{tp.topic}[{tp.partition}]"
                    if info.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise TopicMissing(tp.topic, f"{what} does not exist on {kafka.bootstrap_servers}")
                    forget_admin_client(kafka)
                    raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"{what}: {info.name()}")
                out[(tp.topic, tp.partition)] = info
        answers.append(out)
    return answers


def watermarks(
    kafka: KafkaSettings, partitions: Iterable[TP], *, timeout_s: float = 10.0
) -> dict[TP, tuple[int, int]]:
    """(log start, end) per partition; the end is the LSO under read_committed, the high watermark
    under read_uncommitted (the same level the readers use)."""
    parts = sorted(set(partitions))
    earliest: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    latest: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    low, high = _list_offsets(
        kafka,
        {TopicPartition(t, p): earliest for t, p in parts},
        {TopicPartition(t, p): latest for t, p in parts},
        timeout_s=timeout_s,
    )
    return {key: (low[key].offset, high[key].offset) for key in parts}


def offsets_for_time(
    kafka: KafkaSettings, partitions: Iterable[TP], timestamp_ms: int, *, timeout_s: float = 10.0
) -> dict[TP, int]:
    """Per partition, the first offset whose timestamp is >= `timestamp_ms`, or the end offset if
    there is none (so a start "at a time in the future" reads only what arrives later)."""
    if timestamp_ms < 0:
        raise ConfigError("timestamp", f"must be >= 0 milliseconds since the epoch, got {timestamp_ms}")
    parts = sorted(set(partitions))
    (found,) = _list_offsets(
        kafka,
        {TopicPartition(t, p): OffsetSpec.for_timestamp(timestamp_ms) for t, p in parts},
        timeout_s=timeout_s,
    )
    missing = [key for key in parts if found[key].offset < 0]
    ends = watermarks(kafka, missing, timeout_s=timeout_s) if missing else {}
    return {key: (ends[key][1] if key in ends else found[key].offset) for key in parts}
