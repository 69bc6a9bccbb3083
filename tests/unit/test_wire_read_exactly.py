"""wire.read_exactly over a real loopback TCP connection: an answer written in many small pieces
(as a broker writes a wide Fetch answer, a partition at a time) is read whole and in order into
one buffer; a connection closed mid-answer fails at once, naming it, not after the socket's
timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from txn_offsets.kafka import wire


@contextmanager
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=20.0)
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


def test_an_answer_written_in_small_pieces_is_read_whole_and_in_order() -> None:
    pieces = [bytes([i % 251]) * (100 + i) for i in range(300)]  # ~75 kB in 300 pieces
    answer = b"".join(pieces)
    with connected() as (client, peer):
        writer = threading.Thread(
            target=_write_in_pieces, args=(peer, [*pieces, b"next"], 0.0005), kwargs={"close": False}
        )
        writer.start()
        assert wire.read_exactly(client, len(answer)) == answer
        assert wire.read_exactly(client, 4) == b"next"  # nothing of the next answer read ahead
        writer.join()


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
