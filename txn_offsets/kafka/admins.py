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
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka.causes import Witness
from txn_offsets.kafka.clients import client_config, serve_logs, witness_for

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
    "unreachable",
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
    witnesses: dict[str, Witness] = field(default_factory=dict)  # of the admins, by the same keys
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
            # a look-up of a topic never creates it (an admin client is a producer to librdkafka:
            # it would ask the broker to create it)
            config = {**kafka.client_config(), "allow.auto.create.topics": False}
            witness = _state.witnesses[key] = witness_for(config)  # why it got no answer
            admin = _state.admins[key] = AdminClient(client_config(config, witness))
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
            _state.witnesses.pop(client_key(kafka, role), None)
            _state.contacted.discard(client_key(kafka, role))
            if admin is not None:
                _state.retired.append(_Retired(admin, time.monotonic()))
                gone.append(admin)
    for client in gone:
        serve_logs(client)  # its lines say why (refused, TLS, SASL): to its Witness and the log
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


# a failure seen this long after the first try is no blip: librdkafka has reconnected (its
# reconnect.backoff.ms starts at 100 ms) and been told the same again
SETTLED_S = 1.0
_SLICE_S = 0.1


def _first_answer(admin: AdminClient, key: str, fut: Future[Any], bound: float, servers: list[str]) -> Any:
    """The first contact's answer, waited for up to `bound` (+0.5 s); a TimeoutError sooner once
    every bootstrap server has failed for :data:`SETTLED_S` in a way that names why (refused, a name
    that does not resolve, another protocol, a refused login): the same wait would end the same."""
    started = time.monotonic()
    deadline = started + bound + 0.5
    while True:
        try:
            return fut.result(timeout=max(0.0, min(_SLICE_S, deadline - time.monotonic())))
        except TimeoutError:
            now = time.monotonic()
            if now >= deadline:
                raise
            serve_logs(admin)  # its queued lines and errors: to its witness
            with _state.lock:
                witness = _state.witnesses.get(key)
            if (
                now - started >= SETTLED_S
                and witness is not None
                and witness.failed_all(servers, now - started)
            ):
                raise


def unreachable(
    kafka: KafkaSettings, role: str, within_s: float, fallback: str, *, refusals: bool = False
) -> TxnOffsetsError:
    """The error for a call on the `role` client that Kafka did not answer; the clients of `kafka`
    are retired. It names what librdkafka saw in the last `within_s` seconds (connection refused, a
    host that does not resolve, a failed TLS handshake, a listener of another protocol, a refused
    login; with `refusals`, for a first contact, a refused login or certificate is a ConfigError
    naming the setting: :meth:`.causes.Witness.why`), else says `fallback`."""
    with _state.lock:
        witness = _state.witnesses.get(client_key(kafka, role))
    forget_admin_client(kafka)  # serves the client's queued lines to its witness
    if witness is None:
        witness = witness_for(kafka.client_config())
    return witness.why(within_s, fallback, refusals=refusals)


def connected_admin(kafka: KafkaSettings, timeout_s: float, role: str = "metadata") -> AdminClient:
    """The cached client, after its bootstrap servers answered once: the first call on a new
    client asks for the cluster's brokers bounded by :func:`first_contact_s` (at most
    `timeout_s`), so a Kafka that answers nothing is ServiceUnavailable in seconds, naming why
    when librdkafka said (:func:`unreachable`)."""
    admin = admin_client(kafka, role)
    key = client_key(kafka, role)
    if key in _state.contacted:
        return admin
    bound = max(0.1, min(timeout_s, first_contact_s(kafka)))
    try:
        fut = admin.describe_cluster(request_timeout=bound)
        issued(admin, [fut])
        _first_answer(admin, key, fut, bound, kafka.bootstrap_servers.split(","))
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.code() in NO_ANSWER:
            timed_out = isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT
            said = "" if timed_out else describe_error(exc)
            detail = f"no answer in {bound:g}s" + (f" ({said})" if said else "")
            raise unreachable(kafka, role, bound + 1.0, detail, refusals=True) from None
    except TimeoutError:
        raise unreachable(kafka, role, bound + 1.0, f"no answer in {bound:g}s", refusals=True) from None
    with _state.lock:
        if _state.admins.get(key) is admin:
            _state.contacted.add(key)
    return admin
