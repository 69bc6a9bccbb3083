"""What one named broker itself answers: Metadata v12, ListOffsets v7, Fetch v13 (and
DescribeTopicPartitions v0 where the broker serves it) on one socket.

librdkafka picks the broker each request goes to and keeps the topic ids to itself, so a question
only a given broker can answer - "which log do you hold under this name?" - is asked here, over
:mod:`txn_offsets.kafka.wire`: :func:`connect` opens one connection with the client's own security
settings (PLAINTEXT, SSL, SASL PLAIN or SCRAM-SHA-256/512 over either; anything else is
:class:`Unsupported`), :func:`metadata` is that broker's metadata cache (topic ids, leaders, leader
epochs), :func:`send_topic_ids` the same cache's topic ids without the partitions,
:func:`list_offsets` answers from whatever log the broker holds under the topic's *name*
(ListOffsets carries no topic id), and :func:`fetch` names the topic by its *id*: a broker whose
log under that name belongs to another id answers UNKNOWN_TOPIC_ID or INCONSISTENT_TOPIC_ID.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.kafka import wire

__all__ = [
    "Cluster",
    "Connection",
    "FetchAnswer",
    "Offset",
    "Partition",
    "Topic",
    "Unsupported",
    "check_settings",
    "connect",
    "fetch",
    "fetch_answer",
    "isolation",
    "list_offsets",
    "metadata",
    "metadata_answer",
    "send_fetch",
    "send_metadata",
    "send_topic_ids",
    "supports",
    "topic_ids_answer",
]

METADATA, LIST_OFFSETS, FETCH, SASL_HANDSHAKE, SASL_AUTHENTICATE = 3, 2, 1, 17, 36
API_VERSIONS, DESCRIBE_TOPIC_PARTITIONS = 18, 75
METADATA_V, LIST_OFFSETS_V, FETCH_V = 12, 7, 13
EARLIEST, LATEST = -2, -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


def isolation(level: str) -> int:
    """The Fetch isolation of a client's ``isolation.level`` (librdkafka's default: read_committed)."""
    return READ_UNCOMMITTED if level == "read_uncommitted" else READ_COMMITTED


#: a Metadata answer's partition: error code, index, leader, leader epoch
_PARTITION_HEAD = struct.Struct(">hiii")
_API_RANGE = struct.Struct(">hhh")  # ApiVersions v0: api key, lowest and highest version
_FETCHED_HEAD = struct.Struct(">ihqqq")  # a Fetch answer's partition, up to its aborted transactions


class Unsupported(Exception):
    """The client's settings name something this hand-written client cannot do (a SASL mechanism)."""


@dataclass(frozen=True)
class Partition:
    """A partition as one broker's metadata cache has it."""

    error: int
    leader: int
    leader_epoch: int


@dataclass(frozen=True)
class Topic:
    error: int
    topic_id: str
    partitions: Mapping[int, Partition]


@dataclass(frozen=True)
class Cluster:
    """One broker's own metadata answer."""

    brokers: Mapping[int, tuple[str, int]]  # node id -> (host, port)
    topics: Mapping[str, Topic]


@dataclass(frozen=True)
class Offset:
    error: int
    offset: int
    leader_epoch: int


@dataclass(frozen=True)
class FetchAnswer:
    """A Fetch answer's partition: the log's marks as the broker that holds it under the asked
    topic id has them (-1 when the answer is an error), the (producer id, first offset) of each
    aborted transaction among its records (read_committed), and its record batches (payloads:
    never in a repr, never compared)."""

    error: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    records: bytes = field(default=b"", compare=False, repr=False)

    def end(self, *, read_committed: bool) -> int:
        """The log's end as a reader at that isolation level sees it: the last stable offset
        under read_committed (nothing past an open transaction), else the high watermark."""
        return self.last_stable_offset if read_committed else self.high_watermark


class Connection:
    """One authenticated connection to one broker (:func:`connect`); closed on leaving its block."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.correlation = 0
        self.apis: dict[int, tuple[int, int]] | None = None  # api key -> versions (:func:`supports`)

    def ask(self, api_key: int, version: int, body: bytes, *, flexible: bool) -> wire.Reader:
        return self.answer(self.send(api_key, version, body, flexible=flexible), flexible=flexible)

    def send(self, api_key: int, version: int, body: bytes, *, flexible: bool) -> int:
        """Send a request without waiting for its answer (:meth:`answer`): its correlation id."""
        self.correlation += 1
        self.sock.sendall(wire.frame(api_key, version, self.correlation, body, flexible=flexible))
        return self.correlation

    def answer(self, correlation: int, *, flexible: bool) -> wire.Reader:
        """The answer to the request :meth:`send` sent as `correlation`."""
        return wire.response(self.sock, correlation, flexible=flexible)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SSL_KEYS = {
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
}
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _security(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """(security protocol, SASL mechanism or None), lower/upper case; Unsupported for what this
    client cannot do (checked before any connection is opened)."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if protocol not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
        raise Unsupported(f"security.protocol {protocol}")
    if protocol.endswith("ssl"):
        other = sorted(k for k in config if k.startswith("ssl.") and k not in _SSL_KEYS)
        if other:
            raise Unsupported(f"SSL setting {other[0]}")
    if not protocol.startswith("sasl"):
        return protocol, None
    mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI"))).upper()
    if mechanism not in _MECHANISMS:
        raise Unsupported(f"sasl.mechanism {mechanism}")
    return protocol, mechanism


def check_settings(config: Mapping[str, Any]) -> None:
    """Unsupported when the client's settings name something :func:`connect` cannot do."""
    _security(config)


def _ssl_context(config: Mapping[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.get("ssl.ca.location"))
    if config.get("ssl.certificate.location"):
        context.load_cert_chain(
            config["ssl.certificate.location"], config.get("ssl.key.location"), config.get("ssl.key.password")
        )
    verify = str(config.get("enable.ssl.certificate.verification", "true")).lower() != "false"
    identify = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower() != "none"
    context.check_hostname = verify and identify
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    return context


def connect(config: Mapping[str, Any], host: str, port: int, timeout_s: float) -> Connection:
    """One connection to broker `host`:`port` with the librdkafka properties `config` (the client's
    own: security.protocol, ssl.*, sasl.*), authenticated; a context manager that closes it."""
    protocol, mechanism = _security(config)
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        if protocol.endswith("ssl"):
            sock = _ssl_context(config).wrap_socket(sock, server_hostname=host)
        conn = Connection(sock)
        if mechanism is not None:
            _authenticate(conn, config, mechanism)
    except BaseException:
        sock.close()
        raise
    return conn


def _authenticate(conn: Connection, config: Mapping[str, Any], mechanism: str) -> None:
    """SASL PLAIN, or SCRAM (RFC 5802: the broker's signature checked too), as librdkafka would."""
    shake = conn.ask(SASL_HANDSHAKE, 1, wire.nullable_string(mechanism), flexible=False)
    if (code := shake.int16()) != 0:
        raise OSError(f"SASL handshake refused {mechanism} (error {code})")
    user, password = str(config.get("sasl.username", "")), str(config.get("sasl.password", ""))
    if mechanism == "PLAIN":
        _sasl_step(conn, f"\0{user}\0{password}".encode())
        return
    algorithm = "sha256" if mechanism.endswith("256") else "sha512"
    nonce = base64.b64encode(secrets.token_bytes(24)).decode()
    name = user.replace("=", "=3D").replace(",", "=2C")
    first_bare = f"n={name},r={nonce}"
    server_first = _sasl_step(conn, f"n,,{first_bare}".encode()).decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise OSError("SCRAM: the broker's nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(
        algorithm, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    final_bare = f"c=biws,r={fields['r']}"
    auth = f"{first_bare},{server_first},{final_bare}".encode()
    client_key = hmac.digest(salted, b"Client Key", algorithm)
    signature = hmac.digest(hashlib.new(algorithm, client_key).digest(), auth, algorithm)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    server_final = _sasl_step(conn, f"{final_bare},p={proof}".encode()).decode()
    expected = hmac.digest(hmac.digest(salted, b"Server Key", algorithm), auth, algorithm)
    if not hmac.compare_digest(server_final, "v=" + base64.b64encode(expected).decode()):
        raise OSError("SCRAM: the broker's signature is wrong")


def _sasl_step(conn: Connection, data: bytes) -> bytes:
    body = wire.uvarint(len(data) + 1) + data + b"\0"
    r = conn.ask(SASL_AUTHENTICATE, 2, body, flexible=True)
    code, message = r.int16(), r.compact_string()
    if code != 0:
        raise OSError(f"SASL authentication failed (error {code}: {message})")
    return r.compact_bytes() or b""


def metadata(conn: Connection, topics: Sequence[str]) -> Cluster:
    """The broker's own metadata for `topics` (Metadata v12): the brokers it lists (the live,
    unfenced ones as it knows them) and each topic's id and partitions' leaders and leader epochs."""
    return metadata_answer(conn, send_metadata(conn, topics))


def send_metadata(conn: Connection, topics: Sequence[str]) -> int:
    """Ask :func:`metadata` without waiting (several brokers asked at once): the correlation id."""
    requested = wire.compact_array([bytes(16) + wire.compact_string(t) + b"\0" for t in topics])
    return conn.send(METADATA, METADATA_V, requested + b"\0\0\0", flexible=True)


def metadata_answer(conn: Connection, correlation: int) -> Cluster:
    """The answer to :func:`send_metadata`'s request `correlation`."""
    r = conn.answer(correlation, flexible=True)
    r.int32()  # throttle
    brokers: dict[int, tuple[str, int]] = {}
    for _ in range(r.array()):
        node, host, port = r.int32(), r.compact_string() or "", r.int32()
        r.compact_string()  # rack
        r.skip_tags()
        brokers[node] = (host, port)
    r.compact_string()  # cluster id
    r.int32()  # controller
    out: dict[str, Topic] = {}
    for _ in range(r.array()):
        error, name, topic_id = r.int16(), r.compact_string() or "", r.uuid()
        r.int8()  # internal
        partitions: dict[int, Partition] = {}
        for _ in range(r.array()):  # thousands for a topic of thousands of partitions: few calls each
            p_error, index, leader, epoch = r.fields(_PARTITION_HEAD)
            for _ in range(3):  # replicas, isr, offline
                r.skip_int32s()
            r.skip_tags()
            partitions[index] = Partition(p_error, leader, epoch)
        r.int32()  # authorized operations
        r.skip_tags()
        out[name] = Topic(error, topic_id, partitions)
    return Cluster(brokers, out)


def supports(conn: Connection, api_key: int, version: int) -> bool:
    """Whether the broker serves `api_key` at `version` (ApiVersions v0, asked once per connection;
    an error answer counts as serving nothing beyond what this client always sends)."""
    if conn.apis is None:
        r = conn.ask(API_VERSIONS, 0, b"", flexible=False)
        apis: dict[int, tuple[int, int]] = {}
        if r.int16() == 0:
            for _ in range(r.int32()):
                key, low, high = r.fields(_API_RANGE)
                apis[key] = (low, high)
        conn.apis = apis
    low, high = conn.apis.get(api_key, (0, -1))
    return low <= version <= high


@dataclass(frozen=True)
class IdsAsked:
    """The requests :func:`send_topic_ids` sent: Metadata's correlation id, and the correlation id
    of each topic asked with DescribeTopicPartitions."""

    metadata: int
    described: tuple[tuple[int, str], ...]


def send_topic_ids(conn: Connection, topics: Sequence[str], *, wide: Collection[str] = ()) -> IdsAsked:
    """Ask for the brokers the broker lists and each of `topics`' id, without waiting
    (:func:`topic_ids_answer`): Metadata v12 for the topics, except those in `wide`, which go as
    DescribeTopicPartitions v0 (Kafka >= 3.7 with KRaft; the same metadata cache), one request per
    topic with a limit of one partition, where the broker serves it. A Metadata answer for a topic
    of 4,096 partitions costs the broker ~14 ms of CPU and this client ~8 ms to read, where
    DescribeTopicPartitions costs ~1 and ~0.1; for a topic of 8 partitions it is the other way
    round (0.1-0.25 ms against 0.45-0.8 ms of the broker's CPU)."""
    described = [t for t in topics if t in wide]
    if described and not supports(conn, DESCRIBE_TOPIC_PARTITIONS, 0):
        described = []
    first = send_metadata(conn, [t for t in topics if t not in described])
    asked = []
    for topic in described:  # one topic a request: a limit counts the partitions of all its topics
        body = wire.compact_array([wire.compact_string(topic) + b"\0"]) + struct.pack(">ib", 1, -1) + b"\0"
        asked.append((conn.send(DESCRIBE_TOPIC_PARTITIONS, 0, body, flexible=True), topic))
    return IdsAsked(first, tuple(asked))


def topic_ids_answer(conn: Connection, asked: IdsAsked) -> Cluster:
    """The answers to :func:`send_topic_ids`: the brokers listed and each topic's error and id, with
    its partitions where Metadata was asked for it. ValueError: an answer that does not describe
    the topic asked."""
    cluster = metadata_answer(conn, asked.metadata)
    topics = dict(cluster.topics)
    for correlation, topic in asked.described:
        r = conn.answer(correlation, flexible=True)
        r.int32()  # throttle
        if r.array() < 1:
            raise ValueError(f"DescribeTopicPartitions answered no topic for {topic!r}")
        error, name, topic_id = r.int16(), r.compact_string(), r.uuid()
        if name != topic:
            raise ValueError(f"DescribeTopicPartitions answered for another topic than {topic!r}")
        topics[topic] = Topic(error, topic_id, {})  # the rest of the answer is not read
    return Cluster(cluster.brokers, topics)


def list_offsets(
    conn: Connection,
    topic: str,
    partitions: Mapping[int, int],
    timestamp: int,
    *,
    isolation: int = READ_COMMITTED,
) -> dict[int, Offset]:
    """ListOffsets v7 for `partitions` (index -> current leader epoch, -1: unchecked) of `topic`
    at `timestamp` (:data:`EARLIEST`, :data:`LATEST`, or ms)."""
    parts = [struct.pack(">iiq", p, epoch, timestamp) + b"\0" for p, epoch in partitions.items()]
    body = struct.pack(">ib", -1, isolation)
    body += wire.compact_array([wire.compact_string(topic) + wire.compact_array(parts) + b"\0"]) + b"\0"
    r = conn.ask(LIST_OFFSETS, LIST_OFFSETS_V, body, flexible=True)
    r.int32()
    out: dict[int, Offset] = {}
    for _ in range(r.array()):
        r.compact_string()
        for _ in range(r.array()):
            index, error = r.int32(), r.int16()
            r.int64()  # timestamp
            out[index] = Offset(error, r.int64(), r.int32())
            r.skip_tags()
        r.skip_tags()
    return out


def fetch(
    conn: Connection,
    topic_id: str,
    partitions: Mapping[int, tuple[int, int]],
    *,
    isolation: int = READ_COMMITTED,
    max_bytes: int = 1,
    partition_max_bytes: int = 1,
) -> dict[int, FetchAnswer]:
    """Fetch v13 naming the topic by `topic_id`, for `partitions` (index -> (fetch offset, current
    leader epoch, -1: unchecked)), waiting for nothing; by default asking for one byte (a broker
    still returns a whole first batch): the partitions' marks."""
    correlation = send_fetch(
        conn,
        topic_id,
        partitions,
        isolation=isolation,
        max_bytes=max_bytes,
        partition_max_bytes=partition_max_bytes,
    )
    return fetch_answer(conn, correlation, partitions)


def send_fetch(
    conn: Connection,
    topic_id: str,
    partitions: Mapping[int, tuple[int, int]],
    *,
    isolation: int,
    max_bytes: int,
    partition_max_bytes: int | Mapping[int, int],
) -> int:
    """Ask :func:`fetch` without waiting (several brokers asked at once): the correlation id.
    `partition_max_bytes`: one limit for every partition, or each partition's."""
    limits = partition_max_bytes if isinstance(partition_max_bytes, Mapping) else None
    parts = [
        struct.pack(">iiqiqi", p, epoch, offset, -1, -1, limits[p] if limits else partition_max_bytes) + b"\0"
        for p, (offset, epoch) in partitions.items()
    ]
    topics = wire.compact_array([wire.uuid_bytes(topic_id) + wire.compact_array(parts) + b"\0"])
    body = struct.pack(">iiiibii", -1, 0, 0, max_bytes, isolation, 0, -1) + topics + wire.compact_array([])
    return conn.send(FETCH, FETCH_V, body + wire.compact_string("") + b"\0", flexible=True)


def fetch_answer(conn: Connection, correlation: int, partitions: Iterable[int]) -> dict[int, FetchAnswer]:
    """The answer to :func:`send_fetch`'s request `correlation` for `partitions`: one per partition
    (a partition the broker left out: its top-level error, or -1)."""
    r = conn.answer(correlation, flexible=True)
    r.int32()  # throttle
    top_error = r.int16()
    r.int32()  # session
    out: dict[int, FetchAnswer] = {}
    for _ in range(r.array()):
        r.uuid()
        for _ in range(r.array()):
            # index, error, high watermark, last stable offset, log start: one call (thousands a Fetch)
            index, error, high, stable, start = r.fields(_FETCHED_HEAD)
            aborted = []
            for _ in range(max(0, r.array())):
                aborted.append((r.int64(), r.int64()))  # producer id, first offset
                r.skip_tags()
            r.int32()  # preferred read replica
            records = r.compact_bytes() or b""
            r.skip_tags()
            out[index] = FetchAnswer(error or top_error, high, stable, start, tuple(aborted), records)
        r.skip_tags()
    for p in partitions:
        out.setdefault(p, FetchAnswer(top_error or -1, -1, -1, -1))
    return out
