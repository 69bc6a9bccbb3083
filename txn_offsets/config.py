"""Settings as frozen dataclasses, validated on construction; the environment is read only in `from_env`.

Secrets (the database password, Kafka SASL/SSL passwords) are held in :class:`Secret` (repr and str
never show the value); URLs are shown through :func:`redact_url`, which masks the password and
every query parameter whose name says it is a secret (``sslpassword=``, ``token=``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from txn_offsets.errors import ConfigError
from txn_offsets.redaction import SECRET_KAFKA_KEYS, Secret, redact_url, secret_query_values

__all__ = [
    "DatabaseSettings",
    "KafkaSettings",
    "Secret",
    "database_from_env",
    "from_env",
    "kafka_from_env",
    "redact_url",
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


def _parse_database_url(url: str | URL | Secret) -> URL:
    raw = url.get() if isinstance(url, Secret) else url
    try:
        parsed = make_url(raw) if isinstance(raw, str) else raw
    except (ArgumentError, ValueError):  # ValueError: a non-numeric port
        raise ConfigError(
            "database_url",
            "cannot parse it; expected postgresql+psycopg://user:password@host:port/dbname",
        ) from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            "database_url",
            f"{parsed.get_backend_name()!r} URLs are not supported: txn_offsets needs PostgreSQL "
            f"(postgresql+psycopg://user:password@host:port/dbname)",
        )
    if parsed.get_driver_name() not in ("psycopg", "postgresql", ""):
        raise ConfigError(
            "database_url",
            f"driver {parsed.get_driver_name()!r} is not supported; use postgresql+psycopg://",
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
    ``idle_in_transaction_timeout_s`` (120)
        PostgreSQL ``idle_in_transaction_session_timeout``: a session left idle inside an open
        transaction this long is terminated, releasing its locks.
    ``tcp_keepalives_idle_s`` (30), ``tcp_keepalives_interval_s`` (10), ``tcp_keepalives_count`` (3)
        libpq TCP keepalives (whole numbers; 0 = the operating system's default): a silently dead
        server or network path is noticed after about idle + interval * count seconds.
    ``tcp_user_timeout_s`` (60)
        libpq ``tcp_user_timeout``: data left unacknowledged this long closes the connection.
    ``lineage_retention_days`` (30)
        days the lineage (``commits``) is kept; the planner prunes older rows (store.lineage).
    ``lineage`` (True)
        False: no ``commits`` rows; history/explain show nothing; for measuring its cost (make bench).

    The three PostgreSQL timeouts travel in the libpq ``options`` startup parameter, so the server
    applies them when the session starts (no extra round trip). ``options`` given in the URL's
    query are kept; ours are appended after them, so for the same setting ours win.

    Pickled to Spark executors, every field survives the trip (the URL, password included, as is).
    """

    # the defaults, declared once: __init__'s keywords, from_env and callers read these
    url: URL
    schema: str = "txn_offsets"
    connect_timeout_s: float = 10.0
    lock_timeout_s: float = 30.0
    statement_timeout_s: float = 600.0
    idle_in_transaction_timeout_s: float = 120.0
    tcp_keepalives_idle_s: int = 30
    tcp_keepalives_interval_s: int = 10
    tcp_keepalives_count: int = 3
    tcp_user_timeout_s: float = 60.0
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
            ("tcp_user_timeout_s", tcp_user_timeout_s, "libpq's tcp_user_timeout"),
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

    def connect_args(self) -> dict[str, object]:
        """``create_engine``'s ``connect_args``: connect timeout, TCP keepalives and user timeout, and
        ``options`` setting the PostgreSQL timeouts in milliseconds, after any ``options`` of the URL."""
        server = (
            f"-c lock_timeout={_ms(self.lock_timeout_s)} "
            f"-c statement_timeout={_ms(self.statement_timeout_s)} "
            f"-c idle_in_transaction_session_timeout={_ms(self.idle_in_transaction_timeout_s)}"
        )
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
    (:mod:`txn_offsets.kafka.properties`); bootstrap: `bootstrap`, the file's, or the env's."""
    from txn_offsets.kafka.properties import read_properties

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
