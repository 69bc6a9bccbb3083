"""Settings as frozen dataclasses, validated on construction; the environment is read only in `from_env`.

Secrets (the database password, Kafka SASL/SSL passwords) are held in :class:`Secret`, whose repr
and str never show the value, and URLs are shown through :func:`redact_url`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from txn_offsets.errors import ConfigError

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

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# librdkafka properties whose values must never be shown
_SECRET_KAFKA_KEYS = re.compile(r"password|secret|sasl\.jaas|key\.pem|token", re.IGNORECASE)


class Secret:
    """A string that does not show itself in reprs, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # Settings travel to Spark executors by pickle; the value must survive that trip.
        return (Secret, (self._value,))


def validate_identifier(value: str, what: str) -> str:
    """Accept a lower-case SQL identifier (letters, digits, underscore; <= 63 chars) or raise."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise ConfigError(
            what,
            f"{value!r} is not a valid identifier: use 1-63 lower-case letters, digits or underscores, "
            f"starting with a letter or underscore",
        )
    return value


def redact_url(url: str | URL) -> str:
    """The URL with its password replaced by ***; never raises on garbage (returns a placeholder)."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)


def _parse_database_url(url: str | URL | Secret) -> URL:
    raw = url.get() if isinstance(url, Secret) else url
    try:
        parsed = make_url(raw) if isinstance(raw, str) else raw
    except ArgumentError:
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


@dataclass(frozen=True, repr=False)
class DatabaseSettings:
    """Where the offsets live: a PostgreSQL URL and the schema of the txn_offsets tables."""

    url: URL
    schema: str = "txn_offsets"
    connect_timeout_s: float = 10.0

    def __init__(
        self, url: str | URL | Secret, *, schema: str = "txn_offsets", connect_timeout_s: float = 10.0
    ):
        object.__setattr__(self, "url", _parse_database_url(url))
        object.__setattr__(self, "schema", validate_identifier(schema, "schema"))
        if connect_timeout_s <= 0:
            raise ConfigError("connect_timeout_s", f"must be > 0 seconds, got {connect_timeout_s}")
        object.__setattr__(self, "connect_timeout_s", connect_timeout_s)

    def __repr__(self) -> str:
        return f"DatabaseSettings(url={redact_url(self.url)!r}, schema={self.schema!r})"

    @property
    def display_url(self) -> str:
        return redact_url(self.url)


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
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def client_config(self) -> dict[str, Any]:
        """Properties shared by every client we create (secrets included: never log this)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.extra}

    def __repr__(self) -> str:
        shown = {k: ("***" if _SECRET_KAFKA_KEYS.search(k) else v) for k, v in self.extra.items()}
        return (
            f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, extra={shown!r}, "
            f"isolation_level={self.isolation_level!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_kafka_settings, (self.bootstrap_servers, dict(self.extra), self.isolation_level))


def _kafka_settings(bootstrap: str, extra: dict[str, Any], isolation: str) -> KafkaSettings:
    return KafkaSettings(bootstrap, extra, isolation)


def from_env(environ: Mapping[str, str] | None = None) -> tuple[DatabaseSettings, KafkaSettings]:
    """Settings from TXN_OFFSETS_DATABASE_URL, TXN_OFFSETS_SCHEMA and TXN_OFFSETS_KAFKA_BOOTSTRAP."""
    env = os.environ if environ is None else environ
    url = env.get("TXN_OFFSETS_DATABASE_URL")
    if not url:
        raise ConfigError(
            "TXN_OFFSETS_DATABASE_URL",
            "is not set; export it (e.g. `set -a; . .stack/env; set +a` after `make stack-up`)",
        )
    bootstrap = env.get("TXN_OFFSETS_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise ConfigError("TXN_OFFSETS_KAFKA_BOOTSTRAP", "is not set; export host:port of a Kafka broker")
    db = DatabaseSettings(Secret(url), schema=env.get("TXN_OFFSETS_SCHEMA", "txn_offsets"))
    return db, KafkaSettings(bootstrap)


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
            "is not set; export the postgresql+psycopg:// URL of the offsets database",
        )
    return DatabaseSettings(Secret(url), schema=schema or env.get("TXN_OFFSETS_SCHEMA", "txn_offsets"))


def kafka_from_env(
    environ: Mapping[str, str] | None = None, *, bootstrap: str | None = None
) -> KafkaSettings:
    """Kafka settings from `bootstrap` or TXN_OFFSETS_KAFKA_BOOTSTRAP."""
    env = os.environ if environ is None else environ
    servers = bootstrap or env.get("TXN_OFFSETS_KAFKA_BOOTSTRAP")
    if not servers:
        raise ConfigError(
            "TXN_OFFSETS_KAFKA_BOOTSTRAP",
            "is not set; pass --kafka-bootstrap host:port or export TXN_OFFSETS_KAFKA_BOOTSTRAP",
        )
    return KafkaSettings(servers)
