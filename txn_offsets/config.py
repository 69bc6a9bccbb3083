"""Settings as frozen dataclasses, validated on construction; the environment is read only in `from_env`.

Secrets (the database password, Kafka SASL/SSL passwords) are held in :class:`Secret` (repr and str
never show the value); URLs are shown through :func:`redact_url`, which masks the password and
every query parameter whose name says it is a secret (``sslpassword=``, ``token=``). A URL with a
second, unencoded ``@`` (in the password) is refused without showing any of the password.

Transport security: :func:`check_database_tls` (every engine) and :func:`check_kafka_tls` (every
Kafka client) warn once per process about a server beyond loopback reached without verified TLS,
or refuse it under ``TXN_OFFSETS_REQUIRE_TLS=1``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from txn_offsets.errors import ConfigError
from txn_offsets.redaction import (
    SECRET_KAFKA_KEYS,
    Secret,
    has_unencoded_at,
    redact_url,
    secret_query_values,
)

__all__ = [
    "REQUIRE_TLS",
    "DatabaseSettings",
    "KafkaSettings",
    "TlsGap",
    "check_database_tls",
    "check_kafka_tls",
    "database_from_env",
    "database_tls_gap",
    "enforce_tls",
    "from_env",
    "is_loopback",
    "kafka_from_env",
    "kafka_tls_gap",
    "require_tls",
    "validate_identifier",
]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # used with fullmatch: no "$" newline loophole
_MAX_MS = 2**31 - 1  # PostgreSQL's and libpq's millisecond settings are C ints


def validate_identifier(value: str, what: str) -> str:
    """Accept a lower-case SQL identifier (letters, digits, underscore; <= 63 chars) or raise."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigError(
            what,
            f"{value!r} is not a valid identifier: use 1-63 lower-case letters, digits or underscores, "
            f"starting with a letter or underscore",
        )
    return value


def _refuse_unencoded_at(raw: str) -> None:
    """A URL has one ``@``: the one before the host. A second one (a password or user name with an
    unencoded ``@``) makes the rest of the password parse as the host, which every error would
    then show: refused, without showing anything of the password."""
    if has_unencoded_at(raw):
        raise ConfigError(
            "database_url",
            f"{redact_url(raw)} holds more than one '@': percent-encode each '@' inside the "
            f"password (or the user name, database name or a query value) as %40 (p@ss -> p%40ss); "
            f"only the '@' before the host stays",
        )


_POSTGRES_SCHEMES = ("postgresql", "postgres")


def _parse_database_url(url: str | URL | Secret) -> URL:
    raw = url.get() if isinstance(url, Secret) else url
    if isinstance(raw, str):
        _refuse_unencoded_at(raw)
    try:
        parsed = make_url(raw) if isinstance(raw, str) else raw
    except (ArgumentError, ValueError):  # ValueError: a non-numeric port
        raise ConfigError(
            "database_url",
            "cannot parse it; expected postgresql+psycopg://user:password@host:port/dbname",
        ) from None
    # postgres:// is what many platforms' DATABASE_URL holds (libpq takes both schemes); SQLAlchemy
    # knows only postgresql. Both, without a driver or with psycopg's, become postgresql+psycopg
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _POSTGRES_SCHEMES:
        raise ConfigError(
            "database_url",
            f"{backend!r} URLs are not supported: txn_offsets needs PostgreSQL "
            f"(postgresql+psycopg://user:password@host:port/dbname; postgres:// and postgresql:// too)",
        )
    if driver not in ("psycopg", ""):
        raise ConfigError(
            "database_url",
            f"driver {driver!r} is not supported; use postgresql+psycopg:// (or postgres://)",
        )
    # plain postgresql:// would select psycopg2 in SQLAlchemy; we ship psycopg 3
    return parsed.set(drivername="postgresql+psycopg")


def _seconds(setting: str, value: object, *, what: str) -> float:
    """A finite, non-negative number of seconds (0 = off) that fits PostgreSQL's int milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(setting, f"must be a number of seconds ({what}), got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(setting, f"must be >= 0 seconds (0 turns {what} off), got {value!r}")
    if seconds * 1000 > _MAX_MS:
        raise ConfigError(
            setting,
            f"{value!r} seconds is too long for PostgreSQL; use at most {_MAX_MS // 1000} (or 0: off)",
        )
    return seconds


def _count(setting: str, value: object, *, what: str) -> int:
    """A non-negative whole number for a libpq keepalive setting (0 = the system default)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(setting, f"must be a whole number ({what}), got {value!r}")
    if value < 0 or value > _MAX_MS:
        raise ConfigError(setting, f"must be between 0 (the system default) and {_MAX_MS}, got {value!r}")
    return value


def _ms(seconds: float) -> int:
    """Whole milliseconds; a positive value never rounds down to 0, which would mean "off"."""
    return max(1, round(seconds * 1000)) if seconds > 0 else 0


@dataclass(frozen=True, repr=False)
class DatabaseSettings:
    """Where the offsets live: a PostgreSQL URL and the schema of the txn_offsets tables.

    Timeouts, all applied to every connection made through :meth:`connect_args` (and so by
    :func:`txn_offsets.store.database.engine_for`); the ``*_timeout_s`` values are seconds, 0 turns
    the timeout off, negative values are refused:

    ``connect_timeout_s`` (10)
        libpq ``connect_timeout``: give up connecting after this long (> 0; whole seconds, >= 1).
    ``lock_timeout_s`` (30)
        PostgreSQL ``lock_timeout``: a statement waiting this long for a lock (a row locked
        ``FOR UPDATE`` by a stuck transaction, a table lock) fails with SQLSTATE 55P03
        (see :func:`txn_offsets.store.database.is_lock_timeout`) instead of waiting forever.
    ``statement_timeout_s`` (600)
        PostgreSQL ``statement_timeout``: a statement running this long is cancelled (SQLSTATE
        57014, :func:`txn_offsets.store.database.is_statement_timeout`).
    ``idle_in_transaction_timeout_s`` (30)
        PostgreSQL ``idle_in_transaction_session_timeout``: a session left idle inside an open
        transaction this long (a frozen executor) is terminated, releasing its locks. Above the
        longest idle gap of a commit: the topic proof's wait (at most ~20 s) and the write's Python.
    ``tcp_keepalives_idle_s`` (10), ``tcp_keepalives_interval_s`` (5), ``tcp_keepalives_count`` (2)
        TCP keepalives at BOTH ends (whole numbers; 0 = the operating system's default): libpq's,
        and the server's ``tcp_keepalives_*`` for the session; a silent peer (a cut-off host) is
        dropped after idle + interval * count seconds (:func:`txn_offsets.store.pooler.half_open_s`).
    ``tcp_user_timeout_s`` (20)
        ``tcp_user_timeout`` at both ends (libpq's and the server's): data left unacknowledged this
        long closes the connection; on Linux it also ends keepalive probing at that age.
    ``lineage_retention_days`` (30)
        days the lineage (``commits``) is kept; the planner prunes older rows (store.lineage).
    ``lineage`` (True)
        False: no ``commits`` rows; history/explain show nothing; for measuring its cost (make bench).

    The server settings (:meth:`server_settings`) travel in the libpq ``options`` startup parameter,
    so the server applies them when the session starts (no extra round trip). ``options`` given in the URL's
    query are kept; ours are appended after them, so for the same setting ours win.

    Pickled to Spark executors, every field survives the trip (the URL, password included, as is).
    """

    # the defaults, declared once: __init__'s keywords, from_env and callers read these
    url: URL
    schema: str = "txn_offsets"
    connect_timeout_s: float = 10.0
    lock_timeout_s: float = 30.0
    statement_timeout_s: float = 600.0
    idle_in_transaction_timeout_s: float = 30.0
    tcp_keepalives_idle_s: int = 10
    tcp_keepalives_interval_s: int = 5
    tcp_keepalives_count: int = 2
    tcp_user_timeout_s: float = 20.0
    lineage_retention_days: float = 30.0
    lineage: bool = True

    # each default below is the class attribute of the same name above (bound in the class body)
    def __init__(
        self,
        url: str | URL | Secret,
        *,
        schema: str = schema,
        connect_timeout_s: float = connect_timeout_s,
        lock_timeout_s: float = lock_timeout_s,
        statement_timeout_s: float = statement_timeout_s,
        idle_in_transaction_timeout_s: float = idle_in_transaction_timeout_s,
        tcp_keepalives_idle_s: int = tcp_keepalives_idle_s,
        tcp_keepalives_interval_s: int = tcp_keepalives_interval_s,
        tcp_keepalives_count: int = tcp_keepalives_count,
        tcp_user_timeout_s: float = tcp_user_timeout_s,
        lineage_retention_days: float = lineage_retention_days,
        lineage: bool = lineage,
    ):
        object.__setattr__(self, "url", _parse_database_url(url))
        object.__setattr__(self, "schema", validate_identifier(schema, "schema"))
        if (
            isinstance(connect_timeout_s, bool)
            or not isinstance(connect_timeout_s, int | float)
            or not math.isfinite(connect_timeout_s)
            or not 0 < connect_timeout_s <= _MAX_MS // 1000
        ):
            raise ConfigError(
                "connect_timeout_s",
                f"must be > 0 seconds (e.g. 10; it cannot be turned off), got {connect_timeout_s!r}",
            )
        object.__setattr__(self, "connect_timeout_s", connect_timeout_s)
        for name, value, what in (
            ("lock_timeout_s", lock_timeout_s, "PostgreSQL's lock_timeout"),
            ("statement_timeout_s", statement_timeout_s, "PostgreSQL's statement_timeout"),
            (
                "idle_in_transaction_timeout_s",
                idle_in_transaction_timeout_s,
                "PostgreSQL's idle_in_transaction_session_timeout",
            ),
            ("tcp_user_timeout_s", tcp_user_timeout_s, "tcp_user_timeout"),
        ):
            _seconds(name, value, what=what)
            object.__setattr__(self, name, value)
        for name, count, what in (
            ("tcp_keepalives_idle_s", tcp_keepalives_idle_s, "seconds before the first keepalive"),
            ("tcp_keepalives_interval_s", tcp_keepalives_interval_s, "seconds between keepalives"),
            ("tcp_keepalives_count", tcp_keepalives_count, "unanswered keepalives before giving up"),
        ):
            object.__setattr__(self, name, _count(name, count, what=what))
        days = lineage_retention_days
        if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days < math.inf:
            raise ConfigError("lineage_retention_days", f"must be > 0 days (e.g. 30), got {days!r}")
        if not isinstance(lineage, bool):
            raise ConfigError("lineage", f"must be True or False, got {lineage!r}")
        object.__setattr__(self, "lineage_retention_days", days)
        object.__setattr__(self, "lineage", lineage)

    def __repr__(self) -> str:  # every field but the URL as is; the URL without its password
        shown = "".join(f", {f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "url")
        return f"DatabaseSettings(url={redact_url(self.url)!r}{shown})"

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    def secret_values(self) -> tuple[str, ...]:
        """Every non-empty secret held (the URL's password, its secret query values: :func:`redact_url`),
        longest first: scrubbing text with them in order never leaves part of a longer secret behind."""
        found = [self.url.password, *secret_query_values(self.url)]
        return tuple(sorted({str(v) for v in found if v}, key=lambda v: (-len(v), v)))

    def server_settings(self) -> dict[str, str]:
        """The PostgreSQL settings every session gets, in each one's base unit (as pg_settings shows
        them): the three timeouts (ms), and the server's end of the TCP bounds (s; ms)."""
        return {
            "lock_timeout": str(_ms(self.lock_timeout_s)),
            "statement_timeout": str(_ms(self.statement_timeout_s)),
            "idle_in_transaction_session_timeout": str(_ms(self.idle_in_transaction_timeout_s)),
            "tcp_keepalives_idle": str(self.tcp_keepalives_idle_s),
            "tcp_keepalives_interval": str(self.tcp_keepalives_interval_s),
            "tcp_keepalives_count": str(self.tcp_keepalives_count),
            "tcp_user_timeout": str(_ms(self.tcp_user_timeout_s)),
        }

    def connect_args(self) -> dict[str, object]:
        """``create_engine``'s ``connect_args``: connect timeout, TCP keepalives and user timeout, and
        ``options`` with :meth:`server_settings`, after any ``options`` of the URL."""
        server = " ".join(f"-c {name}={value}" for name, value in self.server_settings().items())
        # connect_args override the URL's query, so the user's options must be carried over here
        given = self.url.query.get("options")
        user = " ".join(given if isinstance(given, tuple) else [given or ""]).strip()
        return {
            "connect_timeout": max(1, round(self.connect_timeout_s)),
            "keepalives": 1,
            "keepalives_idle": self.tcp_keepalives_idle_s,
            "keepalives_interval": self.tcp_keepalives_interval_s,
            "keepalives_count": self.tcp_keepalives_count,
            "tcp_user_timeout": _ms(self.tcp_user_timeout_s),
            "options": f"{user} {server}" if user else server,
        }


@dataclass(frozen=True, repr=False)
class KafkaSettings:
    """How to reach Kafka: bootstrap servers plus any librdkafka properties (SASL, SSL, ...).

    ``isolation_level`` is used both for the end offsets the planner asks for and by the readers,
    so a batch never plans past what its readers can see.
    """

    bootstrap_servers: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    isolation_level: str = "read_committed"

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not isinstance(self.bootstrap_servers, str):
            raise ConfigError(
                "bootstrap_servers", "is empty; give host:port[,host:port...] of the Kafka brokers"
            )
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise ConfigError(
                "isolation_level", f"{self.isolation_level!r}: use 'read_committed' or 'read_uncommitted'"
            )
        reserved = {"enable.auto.commit", "auto.offset.reset", "isolation.level", "bootstrap.servers"}
        clash = sorted(reserved & set(self.extra))
        if clash:
            raise ConfigError(
                f"kafka setting {clash[0]!r}",
                "is managed by txn_offsets (offsets live in PostgreSQL); remove it from the Kafka settings",
            )
        hide = SECRET_KAFKA_KEYS.search  # sasl.password, ssl.key.password, ...: held as Secret
        held = {k: Secret(v) if isinstance(v, str) and hide(k) else v for k, v in self.extra.items()}
        object.__setattr__(self, "extra", MappingProxyType(held))

    def client_config(self) -> dict[str, Any]:
        """Properties shared by every client we create (secrets included, in clear: never log this)."""
        plain = {k: v.get() if isinstance(v, Secret) else v for k, v in self.extra.items()}
        return {"bootstrap.servers": self.bootstrap_servers, **plain}

    def __repr__(self) -> str:
        shown = {k: ("***" if SECRET_KAFKA_KEYS.search(k) else v) for k, v in self.extra.items()}
        return (
            f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, extra={shown!r}, "
            f"isolation_level={self.isolation_level!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_kafka_settings, (self.bootstrap_servers, dict(self.extra), self.isolation_level))

    def __hash__(self) -> int:  # by property names: the values may not be hashable (callbacks)
        return hash((self.bootstrap_servers, self.isolation_level, tuple(sorted(self.extra))))


def _kafka_settings(bootstrap: str, extra: dict[str, Any], isolation: str) -> KafkaSettings:
    return KafkaSettings(bootstrap, extra, isolation)


def from_env(environ: Mapping[str, str] | None = None) -> tuple[DatabaseSettings, KafkaSettings]:
    """Settings from TXN_OFFSETS_DATABASE_URL, TXN_OFFSETS_SCHEMA, TXN_OFFSETS_KAFKA_BOOTSTRAP and
    TXN_OFFSETS_KAFKA_CONFIG (see :func:`kafka_from_env`)."""
    env = os.environ if environ is None else environ
    return database_from_env(env), kafka_from_env(env)


def database_from_env(
    environ: Mapping[str, str] | None = None, *, schema: str | None = None
) -> DatabaseSettings:
    """Database settings from TXN_OFFSETS_DATABASE_URL and (unless `schema` is given) TXN_OFFSETS_SCHEMA.

    The URL is only ever read from the environment: a password must not appear in command lines.
    """
    env = os.environ if environ is None else environ
    url = env.get("TXN_OFFSETS_DATABASE_URL")
    if not url:
        raise ConfigError(
            "TXN_OFFSETS_DATABASE_URL",
            "is not set; export the postgresql+psycopg:// URL of the offsets database (the local "
            "stack's: `set -a; . .stack/env; set +a` after `make stack-up`)",
        )
    return DatabaseSettings(
        Secret(url), schema=schema or env.get("TXN_OFFSETS_SCHEMA", DatabaseSettings.schema)
    )


def kafka_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    bootstrap: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> KafkaSettings:
    """Kafka settings: properties (SASL, SSL...) from `config_file` or $TXN_OFFSETS_KAFKA_CONFIG
    (:mod:`txn_offsets.properties`); bootstrap: `bootstrap`, the file's, or the env's."""
    from txn_offsets.properties import read_properties

    env = os.environ if environ is None else environ
    path = config_file or env.get("TXN_OFFSETS_KAFKA_CONFIG")
    props = read_properties(path) if path else None
    servers = bootstrap or (props.bootstrap if props else None) or env.get("TXN_OFFSETS_KAFKA_BOOTSTRAP")
    if not servers:
        raise ConfigError(
            "TXN_OFFSETS_KAFKA_BOOTSTRAP",
            "is not set; pass --kafka-bootstrap host:port, export it, or set bootstrap.servers in the file",
        )
    return KafkaSettings(servers, props.properties if props else {})


# -- transport security: verified TLS beyond loopback

REQUIRE_TLS = "TXN_OFFSETS_REQUIRE_TLS"
# libpq's modes that check the server's certificate (verify-full also its name)
_VERIFIED_SSLMODES = frozenset({"verify-full", "verify-ca"})
_TLS_PROTOCOLS = frozenset({"ssl", "sasl_ssl"})
_FALSE = frozenset({"false", "0", "no", "off"})
_tls_logger = logging.getLogger("txn_offsets.security")
_tls_lock = threading.Lock()
_tls_warned: dict[str, int] = {}  # "PostgreSQL" / "Kafka" -> pid of the process that warned


@dataclass(frozen=True)
class TlsGap:
    """A connection beyond loopback without verified TLS: the servers (hosts, never a password),
    the setting at fault as set (``sslmode=disable``) and what to change."""

    service: str  # "PostgreSQL" or "Kafka"
    servers: tuple[str, ...]
    setting: str  # the setting to change, as a ConfigError names it
    current: str
    fix: str

    def message(self) -> str:
        return (
            f"{self.service} at {', '.join(self.servers)} is reached without verified TLS "
            f"({self.current}): {self.fix}"
        )


def require_tls(environ: Mapping[str, str] | None = None) -> bool:
    """``TXN_OFFSETS_REQUIRE_TLS``: 1 refuses a connection beyond loopback without verified TLS,
    0 or unset warns once per process."""
    env = os.environ if environ is None else environ
    value = (env.get(REQUIRE_TLS) or "").strip().lower()
    if value in ("", *_FALSE):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(
        REQUIRE_TLS,
        f"{value!r}: use 1 (refuse connections beyond loopback without verified TLS) or 0 (warn once)",
    )


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ``::1`` (also IPv4-mapped); any other name counts as remote."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])  # no IPv6 zone
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _host_of(entry: str) -> str:
    """The host of ``host``, ``host:port``, ``[v6]:port``, ``::1`` or ``PROTOCOL://host:port``."""
    text = entry.strip()
    text = text.split("://", 1)[1] if "://" in text else text
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _listed(value: object) -> list[str]:
    """A setting's values: one string, a tuple of them (a repeated URL query key) or None."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, tuple | list) else [value]
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def database_tls_gap(
    db: DatabaseSettings,
    connect_args: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TlsGap | None:
    """What makes `db`'s connections reach a server beyond loopback without verified TLS (libpq's
    ``sslmode`` other than verify-full / verify-ca; unset is libpq's ``prefer``), or None: verified,
    or loopback / a Unix socket only. `connect_args` (the engine's) win over the URL's query, the
    libpq environment (``PGSSLMODE``, ``PGHOST``...) applies where neither says."""
    env = os.environ if environ is None else environ
    args = connect_args or {}

    def setting(key: str, variable: str) -> list[str]:
        given = args.get(key) if key in args else db.url.query.get(key)
        return _listed(given) or _listed(env.get(variable))

    addresses = setting("hostaddr", "PGHOSTADDR")  # libpq connects to these when given
    if addresses:
        hosts = addresses
    else:
        if "host" in args:  # connect_args replace the URL's host
            named = [_host_of(h) for h in _listed(args["host"])]
        else:  # the URL's host, or its query's host=h1:5432&host=h2 (a multi-host URL)
            named = [db.url.host] if db.url.host else []
            named += [_host_of(h) for h in _listed(db.url.query.get("host"))]
        hosts = named or _listed(env.get("PGHOST"))
    # a path ("/var/run/postgresql", "@abstract") is a Unix socket; none at all: the default socket
    remote = [h for h in dict.fromkeys(hosts) if not h.startswith(("/", "@")) and not is_loopback(h)]
    if not remote:
        return None
    modes = setting("sslmode", "PGSSLMODE")
    mode = modes[-1].lower() if modes else None
    if mode is None and setting("sslrootcert", "PGSSLROOTCERT")[-1:] == ["system"]:
        mode = "verify-full"  # libpq >= 16: sslrootcert=system implies verify-full
    if mode in _VERIFIED_SSLMODES:
        return None
    return TlsGap(
        "PostgreSQL",
        tuple(remote),
        "sslmode",
        f"sslmode={mode}" if mode else "no sslmode: libpq's prefer, the server's certificate unchecked",
        "add sslmode=verify-full and sslrootcert=<the server's CA file> to the database URL's query",
    )


def _off(value: object) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in _FALSE)


def kafka_tls_gap(config: Mapping[str, Any]) -> TlsGap | None:
    """What makes a Kafka client of librdkafka properties `config` reach a broker beyond loopback
    without verified TLS (``security.protocol`` other than SSL / SASL_SSL,
    ``enable.ssl.certificate.verification=false``, ``ssl.endpoint.identification.algorithm=none``),
    or None."""
    servers = _listed(config.get("bootstrap.servers") or config.get("metadata.broker.list"))
    remote = [s for s in dict.fromkeys(servers) if not is_loopback(_host_of(s))]
    if not remote:
        return None
    where = "in the Kafka properties (KafkaSettings.extra, --kafka-config, TXN_OFFSETS_KAFKA_CONFIG)"
    protocol = str(config.get("security.protocol") or "plaintext").strip().lower()
    if protocol not in _TLS_PROTOCOLS:
        return TlsGap(
            "Kafka",
            tuple(remote),
            "security.protocol",
            f"security.protocol={protocol.upper()}",
            f"set security.protocol=SASL_SSL (or SSL) and ssl.ca.location=<the brokers' CA file> {where}",
        )
    if _off(config.get("enable.ssl.certificate.verification")):
        return TlsGap(
            "Kafka",
            tuple(remote),
            "enable.ssl.certificate.verification",
            "enable.ssl.certificate.verification=false",
            f"remove enable.ssl.certificate.verification=false (or set it to true) {where}",
        )
    algorithm = config.get("ssl.endpoint.identification.algorithm")
    if isinstance(algorithm, str) and algorithm.strip().lower() == "none":
        return TlsGap(
            "Kafka",
            tuple(remote),
            "ssl.endpoint.identification.algorithm",
            "ssl.endpoint.identification.algorithm=none: the broker's name unchecked",
            f"set ssl.endpoint.identification.algorithm=https (librdkafka's default) {where}",
        )
    return None


def enforce_tls(gap: TlsGap | None, environ: Mapping[str, str] | None = None) -> None:
    """Refuse `gap` (ConfigError) under ``TXN_OFFSETS_REQUIRE_TLS=1``, else log it as a warning,
    once per process and service (PostgreSQL, Kafka)."""
    strict = require_tls(environ)  # a bad value is an error even where TLS is fine
    if gap is None:
        return
    if strict:
        raise ConfigError(gap.setting, f"{gap.message()}; refused by {REQUIRE_TLS}=1")
    with _tls_lock:
        if _tls_warned.get(gap.service) == os.getpid():
            return
        _tls_warned[gap.service] = os.getpid()
    _tls_logger.warning("%s (%s=1 refuses this; warned once per process)", gap.message(), REQUIRE_TLS)


def check_database_tls(db: DatabaseSettings, connect_args: Mapping[str, object] | None = None) -> None:
    """:func:`enforce_tls` for `db`'s connections (:func:`database_tls_gap`)."""
    enforce_tls(database_tls_gap(db, connect_args))


def check_kafka_tls(config: Mapping[str, Any]) -> None:
    """:func:`enforce_tls` for a Kafka client of properties `config` (:func:`kafka_tls_gap`)."""
    enforce_tls(kafka_tls_gap(config))
