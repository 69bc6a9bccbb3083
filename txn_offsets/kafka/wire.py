"""Kafka's wire format for the few requests librdkafka cannot make: framing, headers, fields, one exchange.

A request is size-prefixed: header (api key, version, correlation id, client id; v2 adds tagged
fields for flexible versions) then the body. Flexible versions write arrays and strings as compact
(length + 1 as an unsigned varint) and end each structure with tagged fields. :class:`Reader` takes
a response apart the same way; :func:`exchange` sends one request on a socket and returns the
reader positioned at the response body. Used by :mod:`txn_offsets.kafka.direct` (one broker's own
answers) and the lab's DescribeQuorum (:mod:`txn_offsets.devstack.lab.quorum`).
"""

from __future__ import annotations

import base64
import socket
import struct

__all__ = [
    "Reader",
    "compact_array",
    "compact_string",
    "exchange",
    "frame",
    "nullable_string",
    "read_exactly",
    "response",
    "uuid_bytes",
    "uuid_text",
    "uvarint",
]

CLIENT_ID = "txn-offsets"


def uvarint(n: int) -> bytes:
    """An unsigned varint (7 bits a byte, low first)."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def uuid_text(raw: bytes) -> str:
    """A topic id's text as librdkafka prints it (the ids the offset rows keep): base64, no padding
    (Kafka's own tools print the URL-safe alphabet: - and _ for + and /)."""
    return base64.b64encode(raw).decode().rstrip("=")


def uuid_bytes(text: str) -> bytes:
    """The 16 bytes of a topic id printed by :func:`uuid_text` (or by Kafka's tools)."""
    raw = base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"{text!r} is not a topic id")
    return raw


def compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data


def nullable_string(text: str) -> bytes:
    """A (non-compact) string: int16 length, then the bytes."""
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


def frame(
    api_key: int, version: int, correlation: int, body: bytes, *, flexible: bool, client: str = CLIENT_ID
) -> bytes:
    """The size-prefixed request: header v1 (v2 when `flexible`: an empty tagged-field section) and `body`."""
    header = struct.pack(">hhi", api_key, version, correlation) + nullable_string(client)
    message = header + (b"\0" if flexible else b"") + body
    return struct.pack(">i", len(message)) + message


_INT8, _INT16, _INT32, _INT64 = (struct.Struct(f) for f in (">b", ">h", ">i", ">q"))


class Reader:
    """A response read field by field, front to back."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def fields(self, layout: struct.Struct) -> tuple[int, ...]:
        """The next fixed-size fields, as `layout` (big-endian) has them: one call for several."""
        values = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return values

    def int8(self) -> int:
        return self._one(_INT8)

    def int16(self) -> int:
        return self._one(_INT16)

    def int32(self) -> int:
        return self._one(_INT32)

    def int64(self) -> int:
        return self._one(_INT64)

    def _one(self, layout: struct.Struct) -> int:
        (value,) = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return int(value)

    def skip_int32s(self) -> None:
        """Skip a compact array of int32 (a partition's replicas, say)."""
        count = self.array()  # first: it moves self.at
        self.at += 4 * max(0, count)

    def uvarint(self) -> int:
        first = self.data[self.at]
        if first < 0x80:  # one byte: most lengths and counts
            self.at += 1
            return first
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def raw(self, size: int) -> bytes | None:
        """The next `size` bytes (None for a negative size: a null field)."""
        if size < 0:
            return None
        data = self.data[self.at : self.at + size]
        self.at += size
        return data

    def uuid(self) -> str:
        """A topic id, as librdkafka prints it (:func:`uuid_text`)."""
        return uuid_text(self.raw(16) or b"")

    def compact_string(self) -> str | None:
        data = self.raw(self.uvarint() - 1)  # the varint is read first: it moves self.at
        return None if data is None else data.decode()

    def string(self) -> str | None:
        data = self.raw(self.int16())
        return None if data is None else data.decode()

    def compact_bytes(self) -> bytes | None:
        return self.raw(self.uvarint() - 1)

    def skip_string(self) -> None:
        self.compact_string()

    def array(self) -> int:
        """The length of a compact array (-1: null)."""
        return self.uvarint() - 1

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            size = self.uvarint()
            self.at += size


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`, read into one buffer.

    A broker writes a wide Fetch answer in pieces of a partition each (a few hundred bytes), and
    they are read as they come: 2,048 partitions take thousands of reads. ``recv(n)`` allocated a
    buffer of the whole rest of the answer for each of them (hundreds of kB: a mapping made and
    unmade by every read); ``recv_into`` fills one buffer of the answer's size. (Not waiting for
    more of the answer before waking, ``SO_RCVLOWAT``: a receive queue of thousands of small
    segments outgrows the socket's buffer, and the kernel collapses it or drops segments -
    docs/benchmarks.md, the seventeenth pass.)"""
    data = bytearray(n)
    with memoryview(data) as view:
        got = 0
        while got < n:
            k = sock.recv_into(view[got:])
            if not k:
                raise OSError("the broker closed the connection")
            got += k
    return bytes(data)


def exchange(sock: socket.socket, request: bytes, correlation: int, *, flexible: bool) -> Reader:
    """Send one framed request and read its response; the reader stands at the response body
    (response header v1 - tagged fields - when `flexible`). ValueError: an answer to another request."""
    sock.sendall(request)
    return response(sock, correlation, flexible=flexible)


def response(sock: socket.socket, correlation: int, *, flexible: bool) -> Reader:
    """Read the response to the request sent as `correlation` (see :func:`exchange`)."""
    size = struct.unpack(">i", read_exactly(sock, 4))[0]
    reader = Reader(read_exactly(sock, size))
    if reader.int32() != correlation:
        raise ValueError("a response to another request")
    if flexible:
        reader.skip_tags()
    return reader
