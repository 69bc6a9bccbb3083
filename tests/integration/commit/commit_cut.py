"""A TCP proxy in front of PostgreSQL that loses ONE COMMIT, deterministically (test helper).

Armed with a marker (bytes of a statement, e.g. ``b"jobs SET generation"``), it watches each
client connection's messages; the first ``COMMIT`` sent on a connection that sent the marker in
its transaction is

* ``"drop"``: never forwarded; both sockets are closed, so the server rolls the transaction back
  (a connection lost before the COMMIT reached the server: not applied);
* ``"cut"``: forwarded, and the client's socket is closed once the server has answered it
  (ReadyForQuery), so the transaction is committed but its acknowledgement is lost.

Only once (later connections pass through untouched). Plain protocol only: an SSL or GSS request
is refused with ``N``, as a server without TLS would (the client then goes on in plain text).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import sqlalchemy as sa

_SSL_OR_GSS = (80877103, 80877104)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class CommitCut:
    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        marker: bytes,
        mode: str,
        on_lost: Callable[[], object] | None = None,
    ) -> None:
        assert mode in ("drop", "cut")
        self.on_lost = on_lost  # runs once the COMMIT is lost, before the client can notice
        self.upstream = (upstream_host, upstream_port)
        self.marker, self.mode = marker, mode
        self.fired = threading.Event()  # the COMMIT was lost
        self.answered = threading.Event()  # "cut": the server answered the lost COMMIT
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """`url` pointed at the proxy, in plain text."""
        u = sa.engine.make_url(url).set(host="127.0.0.1", port=self.port)
        query = {k: v for k, v in u.query.items() if not k.startswith("ssl")}
        u = u.set(query={**query, "sslmode": "disable", "gssencmode": "disable"})
        return u.render_as_string(hide_password=False)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            self._socks += [client, server]
            state = {"cut": False}
            threading.Thread(target=self._upstream, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, state), daemon=True).start()

    def _lost(self) -> None:
        if self.on_lost is not None:
            self.on_lost()

    def _upstream(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        try:
            while True:  # the startup packet (untyped); an SSL/GSS request is refused first
                head = _read(client, 8)
                length, code = struct.unpack("!ii", head)
                body = _read(client, length - 8)
                if length == 8 and code in _SSL_OR_GSS:
                    client.sendall(b"N")
                    continue
                server.sendall(head + body)
                break
            marked = False
            while True:
                head = _read(client, 5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = _read(client, length - 4)
                if self.marker in body:
                    marked = True
                if kind == b"Q" and body.startswith(b"COMMIT") and marked:
                    with self._lock:
                        fire = not self.fired.is_set()
                        self.fired.set()
                    if fire and self.mode == "drop":
                        server.shutdown(socket.SHUT_RDWR)  # the server rolls the transaction back
                        self._lost()
                        raise ConnectionError("COMMIT dropped")
                    if fire:
                        state["cut"] = True
                    marked = False
                server.sendall(head + body)
        except (ConnectionError, OSError):
            pass
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _downstream(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        try:
            while True:
                head = _read(server, 5)
                body = _read(server, struct.unpack("!i", head[1:])[0] - 4)
                if state["cut"]:  # swallow the answer to the lost COMMIT, then hang up on the client
                    if head[:1] == b"Z":
                        self.answered.set()
                        self._lost()
                        raise ConnectionError("COMMIT answered, acknowledgement lost")
                    continue
                client.sendall(head + body)
        except (ConnectionError, OSError):
            pass
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def commit_cut(
    url: str, marker: bytes, mode: str, on_lost: Callable[[], object] | None = None
) -> Iterator[CommitCut]:
    u = sa.engine.make_url(url)
    proxy = CommitCut(str(u.host), int(u.port or 5432), marker, mode, on_lost)
    try:
        yield proxy
    finally:
        proxy.close()
