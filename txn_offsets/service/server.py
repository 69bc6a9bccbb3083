"""Running the service: refuse an exposed bind without a token, bind, print where, serve with
uvicorn until SIGTERM/SIGINT.

A host beyond loopback (anything but 127.0.0.0/8, ::1 and ``localhost``) needs a token, or an
explicit ``insecure_no_token``. The socket is bound here, before uvicorn starts, so a port that
is taken or a host that does not exist is one clear error, and ``--port 0`` can report the port
the system chose. The service's engine has short timeouts of its own (a scrape is a few plain
SELECTs): its sessions never hold a lock and never wait long for one. A stop waits at most 2 s
for requests in flight, then abandons them (see :func:`txn_offsets.service.app.create_app`).

``TXN_OFFSETS_SERVE_GROUPS`` (``job=group,job2=group2``) names the consumer group a job mirrors
to, so the kafka_exporter-compatible series show the job under that group, as kafka_exporter
itself does; a job not listed is shown under its own name.

**Bounds on clients** (:class:`Limits`; ``TXN_OFFSETS_SERVE_MAX_CONNECTIONS``, ``_HEAD_TIMEOUT_S``,
``_MAX_HEAD_BYTES``). uvicorn alone waits for a request head as long as a client likes and accepts
connections until the descriptors run out: 1,100 half-sent requests (no token needed) under the
common limit of 1,024 made accept() fail with EMFILE and an authenticated /metrics time out. So:

* **head deadline** (default 5 s): a connection with no request in progress (new, or idle after a
  response) must complete a request head within it, counted from when it began to wait, so bytes
  trickled in do not extend it; else it is closed (408 first if it had sent part of a head);
* **head size** (default 8 KiB): h11's limit on an incomplete head; a larger one gets 400, closed;
* **connections** (default 256, lowered to fit ``ulimit -n`` with the process's own descriptors
  and two listen queues' worth): one past the limit closes the connection that has waited longest
  without a request in progress (a slow or idle client), or, when all have one in progress, is
  refused with 503 at once. A scraper sends its head as soon as it connects, so slow clients
  never hold it out, and the service answers at once when they leave.

They live in a subclass of uvicorn's h11 protocol (:func:`guarded_protocol`): the server uses h11
even where httptools is installed.

Without a token only loopback Host headers are answered
(:class:`~txn_offsets.service.app.LoopbackHostsOnly`: DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret
from txn_offsets.service.app import LoopbackHostsOnly, Service, create_app, is_loopback
from txn_offsets.service.console.routes import grafana_from_env
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.status import StatusRules
from txn_offsets.store.handle import Store

__all__ = [
    "BACKLOG",
    "DEFAULT_MAX_CONNECTIONS",
    "GROUPS_ENV",
    "INSECURE_FLAG",
    "LIMITS_ENV",
    "TOKEN_ENV",
    "Limits",
    "bind",
    "check_exposure",
    "connection_limit",
    "groups_from_env",
    "guarded_protocol",
    "limits_from_env",
    "serve",
    "token_from_env",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "TXN_OFFSETS_SERVE_TOKEN"  # noqa: S105 - the variable's name, not a token
GROUPS_ENV = "TXN_OFFSETS_SERVE_GROUPS"
INSECURE_FLAG = "--insecure-no-token"
GRACEFUL_STOP_S = 2  # uvicorn's wait for requests in flight after SIGTERM/SIGINT


def token_from_env(environ: dict[str, str] | None = None) -> Secret | None:
    """The bearer token from TXN_OFFSETS_SERVE_TOKEN (unset or empty: no token). A token shorter
    than 16 characters is refused: it would be guessable."""
    env = os.environ if environ is None else environ
    value = (env.get(TOKEN_ENV) or "").strip()
    if not value:
        return None
    if len(value) < 16:
        raise ConfigError(TOKEN_ENV, "is shorter than 16 characters; use a long random token (or unset it)")
    return Secret(value)


def groups_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """job -> consumer group from TXN_OFFSETS_SERVE_GROUPS (``job=group,job2=group2``; unset or
    empty: none). Two jobs under one group would merge their series: refused."""
    from txn_offsets.kafka.mirror import validate_group
    from txn_offsets.store.runs import validate_job

    env = os.environ if environ is None else environ
    groups: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (env.get(GROUPS_ENV) or "").split(","))):
        job, sep, group = (x.strip() for x in item.partition("="))
        if not sep or not job or not group:
            raise ConfigError(GROUPS_ENV, f"{item!r}: give job=group pairs separated by commas")
        try:
            groups[validate_job(job)] = validate_group(group)
        except ConfigError as exc:
            raise ConfigError(GROUPS_ENV, f"{item!r}: {exc}") from None
    taken = [g for g in set(groups.values()) if list(groups.values()).count(g) > 1]
    if taken:
        raise ConfigError(GROUPS_ENV, f"group {sorted(taken)[0]!r} is given to more than one job")
    return groups


# the listen queue; asyncio accepts up to this many at once before any is looked at, and those
# closed for the limit free their descriptors an event-loop turn later: two bursts' worth in use
BACKLOG = 64
DEFAULT_MAX_CONNECTIONS = 256
OWN_DESCRIPTORS = 64  # the process's own: database pool, Kafka clients' sockets and pipes, logs
LOG_EVERY_S = 60.0  # one warning a minute at most, whatever a flood of clients does

# field -> (environment variable, type, lowest, highest)
LIMITS_ENV: Mapping[str, tuple[str, type, float, float]] = {
    "max_connections": ("TXN_OFFSETS_SERVE_MAX_CONNECTIONS", int, 1, 1_000_000),
    "head_timeout_s": ("TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S", float, 0.1, 300.0),
    "max_head_bytes": ("TXN_OFFSETS_SERVE_MAX_HEAD_BYTES", int, 1024, 1024 * 1024),
}


@dataclass(frozen=True)
class Limits:
    """The bounds; ``max_connections`` None: :data:`DEFAULT_MAX_CONNECTIONS`, lowered to fit the
    descriptor limit (:func:`connection_limit`)."""

    max_connections: int | None = None
    head_timeout_s: float = 5.0
    max_head_bytes: int = 8192

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (value is None and f.name == "max_connections") and not _valid(f.name, value):
                raise ConfigError(f.name, f"{value!r}: give {_wanted(f.name)}")


def _valid(name: str, value: object) -> bool:
    _var, kind, low, high = LIMITS_ENV[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind is int and not isinstance(value, int):
        return False
    return bool(math.isfinite(value) and low <= value <= high)


def _wanted(name: str) -> str:
    _var, kind, low, high = LIMITS_ENV[name]
    return f"{'a whole number' if kind is int else 'a number'} from {low:g} to {high:g}"


def limits_from_env(environ: Mapping[str, str] | None = None) -> Limits:
    """Limits from TXN_OFFSETS_SERVE_MAX_CONNECTIONS, _HEAD_TIMEOUT_S and _MAX_HEAD_BYTES (unset or
    empty: the default)."""
    env = os.environ if environ is None else environ
    given: dict[str, Any] = {}
    for name, (var, kind, _low, _high) in LIMITS_ENV.items():
        raw = (env.get(var) or "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if not _valid(name, value):
            raise ConfigError(var, f"{raw!r}: give {_wanted(name)}")
        given[name] = value
    return Limits(**given)


def _descriptor_limit() -> int | None:
    """The soft RLIMIT_NOFILE (None: unlimited, or no such limit on this system)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_limit(limits: Limits, descriptors: int | None = None) -> int:
    """How many connections the server may hold: below the descriptor limit (`descriptors`, else
    the process's ``ulimit -n``) by the process's own descriptors and two listen queues' worth."""
    soft = _descriptor_limit() if descriptors is None else descriptors
    room = None if soft is None else soft - OWN_DESCRIPTORS - 2 * BACKLOG
    var = LIMITS_ENV["max_connections"][0]
    if limits.max_connections is not None:
        if room is not None and limits.max_connections > room:
            raise ConfigError(
                var,
                f"{limits.max_connections} connections do not fit under the descriptor limit of {soft} "
                f"(ulimit -n) with the service's own {OWN_DESCRIPTORS + 2 * BACKLOG}: give at most "
                f"{max(room, 0)}, or raise ulimit -n",
            )
        return limits.max_connections
    if room is None:
        return DEFAULT_MAX_CONNECTIONS
    if room < 16:
        raise ConfigError(
            "ulimit -n",
            f"{soft} file descriptors leave room for {max(room, 0)} connections: raise it to 1024 or more",
        )
    return min(DEFAULT_MAX_CONNECTIONS, room)


def _response(status: str, body: str) -> bytes:
    """A whole HTTP/1.1 response, written before (or instead of) reading a request."""
    data = body.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + data


class _Bounds:
    """What the connections of one server share: the limits, who is open (oldest first), and
    counts of what was closed for the next warning."""

    def __init__(self, max_connections: int, head_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.open: dict[GuardedH11Protocol, None] = {}
        self.closed = {"late": 0, "pushed out": 0, "refused": 0}
        self.logged_at = -math.inf

    def note(self, what: str) -> None:
        self.closed[what] += 1
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            self.logged_at = now
            logger.warning(
                "closed HTTP connections: %d without a complete request head within %gs, %d pushed "
                "out past the limit of %d connections, %d refused (every connection busy)",
                self.closed["late"],
                self.head_timeout_s,
                self.closed["pushed out"],
                self.max_connections,
                self.closed["refused"],
            )
            self.closed = dict.fromkeys(self.closed, 0)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the head deadline and the connection limit (see the module)."""

    bounds: ClassVar[_Bounds]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._served = 0
        self._waiting_since = time.monotonic()
        self._arm()
        bounds = self.bounds
        bounds.open[self] = None
        live = [c for c in bounds.open if not c.transport.is_closing()]
        if len(live) <= bounds.max_connections:
            return
        waiting = [c for c in live if c is not self and c.waiting()]
        if waiting:
            oldest = min(waiting, key=lambda c: c._waiting_since)
            oldest._close(_response("503 Service Unavailable", "too many connections\n"))
            bounds.note("pushed out")
        else:
            self._close(_response("503 Service Unavailable", "too many connections, all busy\n"), always=True)
            bounds.note("refused")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._disarm()
        self.bounds.open.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._served += 1
        if self.waiting():  # not when a pipelined request already started
            self._waiting_since = time.monotonic()
            self._arm()

    def waiting(self) -> bool:
        """Open, and no request in progress: the client's turn (to send a head, or to go)."""
        return not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.bounds.head_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if not self.waiting():
            return  # a request is in progress: its response re-arms the deadline
        started = bool(self.conn.trailing_data[0])
        seconds = f"{self.bounds.head_timeout_s:g}"
        self._close(_response("408 Request Timeout", f"no complete request head within {seconds} s\n"))
        if started or not self._served:  # an idle keep-alive connection's end is no news
            self.bounds.note("late")

    def _close(self, response: bytes, *, always: bool = False) -> None:
        """Close now; `response` first if the client has sent part of a request head (or
        `always`): a client between requests gets a plain close, as at its keep-alive's end."""
        if always or self.conn.trailing_data[0]:
            self.transport.write(response)
        self.transport.close()


def guarded_protocol(max_connections: int, head_timeout_s: float) -> type[GuardedH11Protocol]:
    """A protocol class for one server (uvicorn.Config(http=...)): its connections share bounds."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"bounds": _Bounds(max_connections, head_timeout_s)},
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    if not 0 <= port <= 65535:
        raise ConfigError("--port", f"{port} is not a TCP port (0-65535; 0 picks a free one)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            "--host", f"{host!r} cannot be resolved ({exc.strerror}); give an address such as 127.0.0.1"
        ) from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError("--port", f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def _stop_quietly() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the handler
    that was installed before it: a no-op one here, so a requested stop exits 0 (not -15)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda _signum, _frame: None) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_exposure(host: str, token: Secret | None, *, insecure_no_token: bool = False) -> None:
    """A ConfigError when `host` is beyond loopback, no token is set, and the risk was not
    accepted explicitly."""
    if token is None and not insecure_no_token and not is_loopback(host):
        raise ConfigError(
            "--host",
            f"{host!r} is reachable beyond this machine and {TOKEN_ENV} is not set: anyone could read "
            f"the offsets. Set {TOKEN_ENV} (16+ characters), bind 127.0.0.1, or pass {INSECURE_FLAG} "
            "to serve without a token",
        )


def serve(
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 9478,
    token: Secret | None = None,
    insecure_no_token: bool = False,
    kafka_cache_s: float = 5.0,
    on_listening: Callable[[str], None] = print,
    groups: Mapping[str, str] | None = None,
    rules: StatusRules | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. `on_listening` gets the URL once the socket is bound. `groups`
    (job -> consumer group) defaults to TXN_OFFSETS_SERVE_GROUPS, `rules` to the default status
    thresholds, `limits` (connections, request heads) to TXN_OFFSETS_SERVE_MAX_CONNECTIONS,
    _HEAD_TIMEOUT_S and _MAX_HEAD_BYTES, else the defaults."""
    import uvicorn

    check_exposure(host, token, insecure_no_token=insecure_no_token)
    groups = groups_from_env() if groups is None else dict(groups)
    limits = limits_from_env() if limits is None else limits
    max_connections = connection_limit(limits)  # refused before anything is bound
    view = KafkaView(kafka, ttl_s=kafka_cache_s)
    sock = bind(host, port)
    short = DatabaseSettings(
        db.url,
        schema=db.schema,
        connect_timeout_s=min(db.connect_timeout_s, 5.0),
        lock_timeout_s=1.0,
        statement_timeout_s=5.0,
        idle_in_transaction_timeout_s=10.0,
    )
    store = Store.of(short, pool_size=4, max_overflow=4, pool_timeout=5)
    service = Service(
        store, view, token, rules=rules or StatusRules(), groups=groups, grafana=grafana_from_env()
    )
    try:
        app = create_app(service)  # starts the health checks
        # without a token a web page could read the data through DNS rebinding; with one, the token
        # guards it and scrapers may use any name
        served = LoopbackHostsOnly(app) if token is None else app
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
        if not is_loopback(str(bound_host)) and token is None:
            logger.warning(
                "serving on %s without %s (%s): anyone who can reach this address can read the offsets",
                host,
                TOKEN_ENV,
                INSECURE_FLAG,
            )
        on_listening(f"http://{shown}:{bound_port}")
        # log_config=None: our logging setup (configure_logging) applies to uvicorn's loggers too
        config = uvicorn.Config(
            served,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
            http=guarded_protocol(max_connections, limits.head_timeout_s),
            h11_max_incomplete_event_size=limits.max_head_bytes,
            # uvicorn listens again with its own backlog (2048), and asyncio accepts up to that many
            # at once before any is looked at: keep both to the one the limit counts on
            backlog=BACKLOG,
        )
        server = uvicorn.Server(config)
        with _stop_quietly():
            server.run(sockets=[sock])
    finally:
        service.close()
        sock.close()
        store.engine.dispose()
