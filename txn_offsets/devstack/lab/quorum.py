"""The lab's KRaft quorum as its leader sees it: one DescribeQuorum request (Kafka API 55, version 1)
to a controller listener, so that "ready" means every voter caught up with the metadata log, not
just ports that answer.

librdkafka has no DescribeQuorum and the cached Kafka jars hold no MetadataQuorumCommand, so the
request is written by hand (flexible versions: compact arrays and strings, tagged fields) and the
answer read the same way; :func:`lagging` is the pure judgement (tests/unit/devstack/test_lab_quorum.py).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Quorum", "Voter", "decode", "describe", "encode", "lagging"]

API_KEY = 55  # DescribeQuorum
VERSION = 1  # adds each replica's last fetch and last caught-up times
TOPIC = "__cluster_metadata"
NOT_LEADER = 6  # NOT_LEADER_OR_FOLLOWER: ask another controller
CAUGHT_UP_MS = 5_000  # a voter caught up this recently (by the leader's clock) is caught up


@dataclass(frozen=True)
class Voter:
    node: int
    log_end_offset: int
    last_caught_up_ms: int  # -1: never


@dataclass(frozen=True)
class Quorum:
    error: int  # the partition's error code (0: this controller leads and answered)
    leader: int
    epoch: int
    high_watermark: int
    voters: tuple[Voter, ...]


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(correlation: int, client: str = "txo-lab") -> bytes:
    """The size-prefixed request: header v2 (client id a plain nullable string), then the body."""
    name = client.encode()
    header = struct.pack(">hhih", API_KEY, VERSION, correlation, len(name)) + name + b"\0"
    topic = TOPIC.encode()
    partitions = _uvarint(2) + struct.pack(">i", 0) + b"\0"  # one partition: index 0, no tags
    body = _uvarint(2) + _uvarint(len(topic) + 1) + topic + partitions + b"\0" + b"\0"
    message = header + body
    return struct.pack(">i", len(message)) + message


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def skip_string(self) -> None:
        size = max(0, self.uvarint() - 1)  # read before self.at is: the varint moves it
        self.at += size

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            size = self.uvarint()
            self.at += size


def decode(response: bytes, correlation: int) -> Quorum:
    """The first partition of a DescribeQuorum v1 response (without its size prefix)."""
    r = _Reader(response)
    if r.take(">i") != correlation:
        raise ValueError("a response to another request")
    r.skip_tags()  # response header v1
    top_error = r.take(">h")
    topics = r.uvarint() - 1
    if top_error or topics < 1:
        return Quorum(top_error or -1, -1, -1, -1, ())
    r.skip_string()
    if r.uvarint() - 1 < 1:
        return Quorum(-1, -1, -1, -1, ())
    r.take(">i")  # partition index
    error, leader, epoch, high = r.take(">h"), r.take(">i"), r.take(">i"), r.take(">q")
    voters = []
    for _ in range(r.uvarint() - 1):
        node, end, _fetch, caught = r.take(">i"), r.take(">q"), r.take(">q"), r.take(">q")
        r.skip_tags()
        voters.append(Voter(node, end, caught))
    return Quorum(error, leader, epoch, high, tuple(voters))


def describe(controllers: Sequence[tuple[str, int]], timeout_s: float = 5.0) -> Quorum:
    """The quorum as its leader answers it: each controller asked in turn until one leads."""
    last = Quorum(-1, -1, -1, -1, ())
    for n, (host, port) in enumerate(controllers, 1):
        try:
            with socket.create_connection((host, port), timeout=timeout_s) as sock:
                sock.sendall(encode(n))
                size = struct.unpack(">i", _exactly(sock, 4))[0]
                last = decode(_exactly(sock, size), n)
        except (OSError, ValueError, struct.error, IndexError):
            continue
        if last.error == 0:
            return last
    return last


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("the controller closed the connection")
        data += chunk
    return bytes(data)


def lagging(quorum: Quorum, voters: int, now_ms: int) -> str:
    """'' when a leader answered and every one of the `voters` voters caught up with it within
    CAUGHT_UP_MS of `now_ms`; else what is missing."""
    if quorum.error != 0 or quorum.leader < 0:
        return f"no quorum leader answered (error {quorum.error})"
    if len(quorum.voters) < voters:
        return f"{len(quorum.voters)} of {voters} voters in the quorum"
    behind = [
        f"node {v.node} at {v.log_end_offset} of {quorum.high_watermark}"
        for v in quorum.voters
        if v.last_caught_up_ms < 0 or now_ms - v.last_caught_up_ms > CAUGHT_UP_MS
    ]
    return "; ".join(behind) and f"voters behind the leader {quorum.leader}: {'; '.join(behind)}"
