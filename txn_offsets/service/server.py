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
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping

from txn_offsets.config import DatabaseSettings, KafkaSettings, Secret
from txn_offsets.errors import ConfigError
from txn_offsets.service.app import Service, create_app
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.status import StatusRules
from txn_offsets.store.database import engine_for

__all__ = [
    "GROUPS_ENV",
    "INSECURE_FLAG",
    "TOKEN_ENV",
    "bind",
    "check_exposure",
    "groups_from_env",
    "is_loopback",
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
        sock.listen(128)
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


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) and ``localhost``; anything else (0.0.0.0, ::, a name,
    an empty host) reaches beyond this machine, or may."""
    host = host.strip().removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


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
) -> None:
    """Serve until SIGTERM/SIGINT. `on_listening` gets the URL once the socket is bound. `groups`
    (job -> consumer group) defaults to TXN_OFFSETS_SERVE_GROUPS, `rules` to the default status
    thresholds."""
    import uvicorn

    check_exposure(host, token, insecure_no_token=insecure_no_token)
    groups = groups_from_env() if groups is None else dict(groups)
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
    engine = engine_for(short, pool_size=4, max_overflow=4, pool_timeout=5)
    service = Service(engine, short, view, token, rules=rules or StatusRules(), groups=groups)
    try:
        app = create_app(service)  # starts the health checks
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
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
        )
        server = uvicorn.Server(config)
        with _stop_quietly():
            server.run(sockets=[sock])
    finally:
        service.close()
        sock.close()
        engine.dispose()
