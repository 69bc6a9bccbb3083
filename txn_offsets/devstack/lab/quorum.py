"""The lab's KRaft quorum as its leader sees it: one DescribeQuorum request (Kafka API 55, version 1)
to a controller listener, so that "ready" means every voter caught up with the metadata log, not
just ports that answer.

librdkafka has no DescribeQuorum and the cached Kafka jars hold no MetadataQuorumCommand, so the
request is written by hand with :mod:`txn_offsets.kafka.wire` and the answer read the same way;
:func:`lagging` is the pure judgement (tests/unit/devstack/test_lab_quorum.py).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from txn_offsets.kafka import wire

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


def encode(correlation: int, client: str = "txo-lab") -> bytes:
    """The size-prefixed request: header v2, then the body (one topic, one partition, no tags)."""
    partitions = wire.compact_array([struct.pack(">i", 0) + b"\0"])
    body = wire.compact_array([wire.compact_string(TOPIC) + partitions + b"\0"]) + b"\0"
    return wire.frame(API_KEY, VERSION, correlation, body, flexible=True, client=client)


def decode(response: bytes, correlation: int) -> Quorum:
    """The first partition of a DescribeQuorum v1 response (without its size prefix)."""
    r = wire.Reader(response)
    if r.int32() != correlation:
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
                size = struct.unpack(">i", wire.read_exactly(sock, 4))[0]
                last = decode(wire.read_exactly(sock, size), n)
        except (OSError, ValueError, struct.error, IndexError):
            continue
        if last.error == 0:
            return last
    return last


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
