"""The process's AdminClients: one per Kafka settings, connected once, forgotten after Kafka was
unreachable, and destroyed only when that is safe.

A client is never destroyed by dropping a reference at an arbitrary moment. librdkafka aborts the
whole process when a client's last reference goes in one of its own threads (``rd_kafka_destroy``
"from librdkafka owned thread is prohibited"): an admin future's callback runs in such a thread,
and Python's cyclic GC, set off there, freed the frames of a failed plan that held the last
reference - the Python data source process of a streaming query died while its topic was being
re-created. And a client destroyed while one of its requests is still in flight crashes when the
answer arrives. So a forgotten client is *retired*: kept here until nothing else references it
and every future issued on it (:func:`issued`) has been done for :data:`RETIRED_GRACE_S`, then
destroyed by :func:`reap` in a thread of ours.

Each settings have one client per *role*: ``metadata`` (describe topics and cluster, list topics),
``offsets`` (ListOffsets) and ``groups`` (consumer-group offsets). librdkafka 2.16 corrupts its
heap (double free, or the assertion ``rko->rko_op_cb``) when a DescribeTopics and a ListOffsets
are in flight on the same client while their topic is deleted and created again - reproduced
with confluent-kafka alone, in seconds; with the two on different clients, not in minutes."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka import auth
from txn_offsets.kafka.clients import client_config, serve_logs

__all__ = [
    "FIRST_CONTACT_S",
    "NO_ANSWER",
    "RETIRED_GRACE_S",
    "ROLES",
    "admin_client",
    "client_key",
    "connected_admin",
    "describe_error",
    "first_contact_s",
    "forget_admin_client",
    "in_flight",
    "issued",
    "reap",
]

FIRST_CONTACT_S = 4.0
# the errors that mean nobody answered (any other error is an answer: no reason for a new client)
NO_ANSWER = {
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
}
RETIRED_GRACE_S = 2.0  # after its last future was seen done: the callback that set it has returned
_ONLY_RETIRED = 2  # sys.getrefcount of a retired client nobody uses: its _Retired's and the call's


@dataclass
class _Retired:
    admin: AdminClient
    quiet_since: float  # since when all its futures were seen done


@dataclass
class _State:
    admins: dict[str, AdminClient] = field(default_factory=dict)
    contacted: set[str] = field(default_factory=set)  # keys whose bootstrap servers answered
    in_flight: dict[int, list[Future[Any]]] = field(default_factory=dict)  # id(client) -> futures
    retired: list[_Retired] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()


ROLES = ("metadata", "offsets", "groups")


def client_key(kafka: KafkaSettings, role: str = "metadata") -> str:
    if role not in ROLES:
        raise ValueError(f"admin client role {role!r}: one of {', '.join(ROLES)}")
    return repr((kafka.bootstrap_servers, sorted(kafka.client_config().items()), role))  # passwords too


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err: KafkaError = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def issued(admin: AdminClient, futures: Iterable[Future[Any]]) -> None:
    """Record futures of requests sent through `admin`: it is not destroyed before they are done."""
    with _state.lock:
        pending = [f for f in _state.in_flight.get(id(admin), ()) if not f.done()]
        pending.extend(futures)
        _state.in_flight[id(admin)] = pending


def in_flight(admin: AdminClient) -> list[Future[Any]]:
    """The futures issued on `admin` (:func:`issued`) not done yet."""
    with _state.lock:
        return [f for f in _state.in_flight.get(id(admin), ()) if not f.done()]


def admin_client(kafka: KafkaSettings, role: str = "metadata") -> AdminClient:
    """One AdminClient per Kafka settings and role in this process: a plan makes three metadata
    calls, and a new client per call costs a connection and a bootstrap round trip each time (and
    stalls of a second or more on a busy machine). AdminClient is thread-safe."""
    key = client_key(kafka, role)
    if _state.retired:
        reap()
    with _state.lock:
        admin = _state.admins.get(key)
        if admin is None:
            # SASL/TLS refusals through error_cb; and a look-up of a topic never creates it (an
            # admin client is a producer to librdkafka: it would ask the broker to create it)
            config = {
                **kafka.client_config(),
                "error_cb": auth.error_cb(key),
                "allow.auto.create.topics": False,
            }
            admin = _state.admins[key] = AdminClient(client_config(config))
    serve_logs(admin)
    return admin


def forget_admin_client(kafka: KafkaSettings, roles: Sequence[str] = ROLES) -> None:
    """Retire the cached clients (every role, or those of `roles`) after Kafka was unreachable: a
    client kept for an address that does not answer reconnects (and logs) forever; the next call
    makes a fresh one. A retired client is destroyed only once its requests are answered (:func:`reap`)."""
    gone: list[AdminClient] = []
    with _state.lock:
        for role in roles:
            admin = _state.admins.pop(client_key(kafka, role), None)
            _state.contacted.discard(client_key(kafka, role))
            if admin is not None:
                _state.retired.append(_Retired(admin, time.monotonic()))
                gone.append(admin)
    for client in gone:
        serve_logs(client)  # its lines say why (refused, TLS, SASL): logged once, de-duplicated
    reap()  # older ones (these are kept for RETIRED_GRACE_S at least)


def reap() -> int:
    """Destroy, in this thread, the retired clients that nothing else references and whose requests
    have all been answered for :data:`RETIRED_GRACE_S`; return how many are still kept."""
    now = time.monotonic()
    doomed: list[AdminClient] = []
    with _state.lock:
        for i in reversed(range(len(_state.retired))):
            old = _state.retired[i]
            pending = [f for f in _state.in_flight.pop(id(old.admin), ()) if not f.done()]
            if pending:  # (done ones are let go: a failed one's traceback can hold the client)
                _state.in_flight[id(old.admin)] = pending
                old.quiet_since = now
            elif now - old.quiet_since >= RETIRED_GRACE_S and sys.getrefcount(old.admin) <= _ONLY_RETIRED:
                doomed.append(_state.retired.pop(i).admin)
        kept = len(_state.retired)
    doomed.clear()  # their last references: rd_kafka_destroy runs here
    return kept


def first_contact_s(kafka: KafkaSettings) -> float:
    """How long a new client waits for the bootstrap servers' first answer."""
    setup_ms = kafka.extra.get("socket.connection.setup.timeout.ms")
    return FIRST_CONTACT_S if setup_ms is None else float(setup_ms) / 1000.0


def connected_admin(kafka: KafkaSettings, timeout_s: float, role: str = "metadata") -> AdminClient:
    """The cached client, after its bootstrap servers answered once: the first call on a new
    client asks for the cluster's brokers bounded by :func:`first_contact_s` (at most
    `timeout_s`), so a Kafka that answers nothing is ServiceUnavailable in seconds."""
    admin = admin_client(kafka, role)
    key = client_key(kafka, role)
    if key in _state.contacted:
        return admin
    bound = max(0.1, min(timeout_s, first_contact_s(kafka)))
    try:
        fut = admin.describe_cluster(request_timeout=bound)
        issued(admin, [fut])
        fut.result(timeout=bound + 0.5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.code() in NO_ANSWER:
            forget_admin_client(kafka)
            auth.raise_if_refused(kafka, key)  # a refused login or certificate: named
            timed_out = isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT
            said = "" if timed_out else describe_error(exc)
            detail = f"no answer in {bound:g}s" + (f" ({said})" if said else "")
            raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, detail) from None
    except TimeoutError:
        forget_admin_client(kafka)
        auth.raise_if_refused(kafka, key)
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, f"no answer in {bound:g}s") from None
    with _state.lock:
        if _state.admins.get(key) is admin:
            _state.contacted.add(key)
    return admin
