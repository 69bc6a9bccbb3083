"""wire.read_exactly over a real loopback TCP connection: an answer written in many small pieces
(as a broker writes a wide Fetch answer, a partition at a time) is read whole, in order, in a few
wake-ups instead of one per piece; the socket's wake-up threshold is back to 1 afterwards; a
connection closed mid-answer fails at once, not after the socket's timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from txn_offsets.kafka import wire


class CountingSocket(socket.socket):
    """A TCP socket counting its reads."""

    reads = 0

    def recv_into(self, buffer: object, nbytes: int = 0, flags: int = 0) -> int:
        self.reads += 1
        return super().recv_into(buffer, nbytes, flags)  # type: ignore[arg-type]

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.reads += 1
        return super().recv(bufsize, flags)


@contextmanager
def connected() -> Iterator[tuple[CountingSocket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = CountingSocket(socket.AF_INET, socket.SOCK_STREAM)
        client.settimeout(20.0)
        client.connect(server.getsockname())
        peer, _ = server.accept()
        try:
            yield client, peer
        finally:
            peer.close()
            client.close()


def _write_in_pieces(peer: socket.socket, pieces: list[bytes], pause_s: float, *, close: bool) -> None:
    for piece in pieces:
        peer.sendall(piece)
        time.sleep(pause_s)
    if close:
        peer.shutdown(socket.SHUT_WR)


def test_an_answer_written_in_small_pieces_is_read_whole_in_a_few_wakeups() -> None:
    # 300 pieces of 1 kB (300 kB), a pause after each: read as they came, one recv a piece at least
    pieces = [bytes([i % 251]) * 1000 for i in range(300)]
    with connected() as (client, peer):
        writer = threading.Thread(
            target=_write_in_pieces, args=(peer, pieces, 0.001), kwargs={"close": False}
        )
        writer.start()
        data = wire.read_exactly(client, 300_000)
        writer.join()
        assert data == b"".join(pieces)
        # 300 kB at >= 64 kB a wake-up: 5 reads (a few more if the kernel wakes early)
        assert client.reads <= 12, client.reads
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        # the next read of the connection (a small one) is not held back by the threshold
        peer.sendall(b"\x00\x00\x00\x07")
        assert wire.read_exactly(client, 4) == b"\x00\x00\x00\x07"


def test_a_small_answer_is_read_as_it_comes() -> None:
    with connected() as (client, peer):
        peer.sendall(b"x" * 1000)
        assert wire.read_exactly(client, 1000) == b"x" * 1000
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1


def test_a_connection_closed_mid_answer_fails_at_once() -> None:
    with connected() as (client, peer):
        writer = threading.Thread(
            target=_write_in_pieces, args=(peer, [b"y" * 10_000] * 3, 0.01), kwargs={"close": True}
        )
        writer.start()
        t0 = time.monotonic()
        with pytest.raises(OSError, match="closed the connection"):
            wire.read_exactly(client, 200_000)
        writer.join()
        assert time.monotonic() - t0 < 10.0  # the socket's timeout is 20 s
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
