"""The offsets client's partition leaders, looked up before a ListOffsets request needs them.

rd_kafka_ListOffsets looks each partition's leader up in the client's metadata cache *in the
calling thread*. When one is missing it registers the request to run again on the next cache
change and asks for a refresh; a cache change that arrives before the caller has left that lookup
runs the same request in librdkafka's main thread as well, and that thread may finish and free it
while the caller still uses it (read from librdkafka 2.16's rdkafka_partition.c,
``query_leaders_async_worker``). CI saw a segmentation fault inside ``list_offsets`` in the driver:
the second of two ListOffsets asked back to back for a topic the client had never looked up.

So :func:`ensure` looks a topic up with one synchronous Metadata request the first time the client
is asked about it (or about more partitions than it knows, or after an answer said its knowledge
was out of date: :func:`forget_leaders`), and raises instead of letting a request go out for a partition
without a leader. With every leader in the cache, the lookup in the caller completes there and
registers nothing. A look-up waits until no ListOffsets of this process is in flight on that client
and none starts meanwhile (:func:`asking`): a Metadata request answered while a ListOffsets was in
flight on the same client, its topic being re-created, corrupted librdkafka's heap (see
:mod:`txn_offsets.kafka.admins`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable, TopicMissing
from txn_offsets.kafka.admins import describe_error, in_flight
from txn_offsets.ranges import TopicPartition as TP

__all__ = ["ONE_BY_ONE", "RETRY_S", "asking", "ensure", "forget_leaders"]

RETRY_S = 0.1  # between look-ups of a topic some of whose partitions have no leader yet
ONE_BY_ONE = 3  # up to this many topics to look up: one request each; more: one for all topics


@dataclass
class _Client:
    admin_id: int  # id() of the client this knowledge is about (a new client knows nothing)
    lock: threading.Lock = field(default_factory=threading.Lock)
    known: dict[str, int] = field(default_factory=dict)  # topic -> partitions 0..n-1 have leaders


_clients: dict[str, _Client] = {}  # client key -> what that client looked up
_clients_lock = threading.Lock()


def _client(key: str, admin: AdminClient) -> _Client:
    with _clients_lock:
        state = _clients.get(key)
        if state is None or state.admin_id != id(admin):
            state = _clients[key] = _Client(id(admin))
        return state


@contextlib.contextmanager
def asking(key: str, admin: AdminClient) -> Iterator[None]:
    """Hold while sending a ListOffsets request on `admin`: no look-up runs meanwhile."""
    with _client(key, admin).lock:
        yield


def _missing(state: _Client, partitions: Iterable[TP]) -> dict[str, int]:
    need: dict[str, int] = {}
    for topic, partition in partitions:
        need[topic] = max(need.get(topic, 0), partition + 1)
    return {t: n for t, n in need.items() if state.known.get(t, 0) < n}


def ensure(
    kafka: KafkaSettings, key: str, admin: AdminClient, partitions: Iterable[TP], timeout_s: float
) -> None:
    """Make sure `admin` has looked up the leader of every partition in `partitions`.

    A topic Kafka does not know, or a partition past its last, is TopicMissing; a partition without
    a leader now (the topic just created or re-created, a broker down) is ServiceUnavailable."""
    state = _client(key, admin)
    wanted = list(partitions)
    if not _missing(state, wanted):  # the usual case: known, no lock needed
        return
    deadline = time.monotonic() + timeout_s
    while True:
        with state.lock:  # no ListOffsets of ours goes out on this client meanwhile
            need = _missing(state, wanted)  # another thread may have looked them up meanwhile
            if not need:
                return
            _, unanswered = concurrent.futures.wait(
                in_flight(admin), timeout=max(0.0, deadline - time.monotonic())
            )
            if unanswered:
                said = f"{len(unanswered)} offset requests unanswered in {timeout_s:g}s"
                raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, said)
            known, waiting = _look_up(kafka, admin, need, deadline)
            state.known.update(known)
        if not waiting:
            return
        if time.monotonic() + RETRY_S > deadline:
            raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, waiting[0])
        time.sleep(RETRY_S)  # the lock released: the other topics' offsets are asked meanwhile


def _look_up(
    kafka: KafkaSettings, admin: AdminClient, need: dict[str, int], deadline: float
) -> tuple[dict[str, int], list[str]]:
    """One look-up of the topics of `need`: a Metadata request per topic for up to
    :data:`ONE_BY_ONE` topics, else ONE for all the cluster's topics (a pattern's hundreds of new
    topics are one round trip, not hundreds). Returns how many partitions (0..n-1, each with a
    leader) `admin` now knows of each topic that has at least the count needed, and what is wrong
    with the others (a partition without a leader: a topic just created, partitions just added, a
    broker down), to be asked again."""
    where = kafka.bootstrap_servers
    left = max(0.1, deadline - time.monotonic())
    topics: dict[str, Any] = {}  # name -> TopicMetadata (confluent-kafka's, untyped)
    try:
        if len(need) <= ONE_BY_ONE:
            for t in sorted(need):
                topics.update(admin.list_topics(topic=t, timeout=left).topics)
        else:
            topics = admin.list_topics(timeout=left).topics
    except KafkaException as exc:
        said = describe_error(exc)
        raise ServiceUnavailable("Kafka", where, f"metadata for {sorted(need)[0]!r}: {said}") from None
    known: dict[str, int] = {}
    waiting: list[str] = []
    for topic, count in sorted(need.items()):
        info = topics.get(topic)
        code = info.error.code() if info is not None and info.error is not None else None
        if info is None or code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise TopicMissing(topic, f"topic {topic!r} does not exist on {where}")
        beyond = [p for p in range(count) if p not in info.partitions]
        if code is None and beyond:
            raise TopicMissing(topic, f"{topic}[{beyond[0]}] does not exist on {where}")
        led = 0
        while led in info.partitions and info.partitions[led].leader >= 0:
            led += 1
        if code is None and led >= count:
            known[topic] = led
        else:
            said = info.error.str() if info.error is not None else f"{topic}[{led}] has no leader"
            waiting.append(f"metadata for {topic!r}: {said}")
    return known, waiting


def forget_leaders(key: str, topic: str) -> None:
    """After an answer that said the client's metadata of `topic` is out of date: look it up again."""
    with _clients_lock:
        state = _clients.get(key)
    if state is not None:
        with state.lock:
            state.known.pop(topic, None)
