"""Kafka client properties from a file (``--kafka-config FILE`` / ``TXN_OFFSETS_KAFKA_CONFIG``), as
kafka-consumer-groups.sh's ``--command-config`` takes them: ``key=value`` lines (``key: value`` and
``key value`` too, as Java reads them), ``#`` and ``!`` comments, blank lines.

The keys are librdkafka's (``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
``sasl.password``, ``ssl.ca.location``, ...). Every key is checked by librdkafka itself (a client
is configured, never connected): an unknown key, a bad value or a missing file is a
:class:`~txn_offsets.errors.ConfigError` that names the key and the file. Keys txn_offsets manages
(``isolation.level``, ``enable.auto.commit``, ...) are refused. ``bootstrap.servers`` may be given:
it is the bootstrap unless ``--kafka-bootstrap`` is. Secret values (``sasl.password``,
``ssl.key.password``, ...: :data:`~txn_offsets.redaction.SECRET_KAFKA_KEYS`) are held as
:class:`~txn_offsets.redaction.Secret` and appear in no message: errors name lines and keys, never
values.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txn_offsets.errors import ConfigError
from txn_offsets.redaction import MASK, SECRET_KAFKA_KEYS, Secret

__all__ = ["MANAGED", "KafkaProperties", "read_properties"]

# set by txn_offsets for every client (offsets live in PostgreSQL) or per client (its own callbacks)
MANAGED = frozenset(
    {
        "enable.auto.commit",
        "enable.auto.offset.store",
        "auto.offset.reset",
        "isolation.level",
        "enable.partition.eof",
        "error_cb",
        "stats_cb",
        "throttle_cb",
        "oauth_cb",
        "on_commit",
        "logger",
    }
)
# Java client properties librdkafka has no use for, with what to write instead
_JAVA_ONLY = {
    "sasl.jaas.config": "give sasl.username and sasl.password instead",
    "ssl.truststore.location": "give ssl.ca.location (the CA certificate as a PEM file) instead",
    "ssl.truststore.password": "give ssl.ca.location (the CA certificate as a PEM file) instead",
    "ssl.truststore.type": "give ssl.ca.location (the CA certificate as a PEM file) instead",
    "key.deserializer": "remove it: txn_offsets hands your code the raw bytes",
    "value.deserializer": "remove it: txn_offsets hands your code the raw bytes",
}
_SEPARATOR = re.compile(r"\s*[=:]\s*|\s+")
_quiet = logging.getLogger("txn_offsets.properties.check")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


@dataclass(frozen=True, repr=False)
class KafkaProperties:
    """A properties file's settings: its ``bootstrap.servers`` (or None) and the other properties,
    secret values as :class:`Secret`."""

    path: Path
    bootstrap: str | None
    properties: dict[str, Any]

    def __repr__(self) -> str:
        shown = {k: MASK if isinstance(v, Secret) else v for k, v in self.properties.items()}
        return f"KafkaProperties(path={str(self.path)!r}, bootstrap={self.bootstrap!r}, properties={shown!r})"


def _setting(path: Path) -> str:
    return f"kafka config {str(path)!r}"


def _parse(path: Path, text: str) -> dict[str, str]:
    found: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        parts = _SEPARATOR.split(line, maxsplit=1)
        key, value = parts[0], (parts[1] if len(parts) > 1 else "")
        if not key:
            raise ConfigError(_setting(path), f"line {number} has no key: write key=value")
        if key in found:
            raise ConfigError(
                _setting(path), f"{key!r} is set twice (lines {found[key][0]} and {number}): keep one"
            )
        if not value:
            raise ConfigError(_setting(path), f"{key!r} (line {number}) has no value: write {key}=value")
        found[key] = (number, value)
    return {key: value for key, (_, value) in found.items()}


def _check_with_librdkafka(path: Path, props: dict[str, str]) -> None:
    """Configure (never connect) a librdkafka client with the properties: librdkafka names an
    unknown key, a bad value, a missing CA file. Its text is shown without any secret value."""
    from confluent_kafka import Consumer, KafkaException

    try:
        # no bootstrap.servers: the client is created but never connects
        Consumer({**props, "group.id": "txn-offsets-config-check", "logger": _quiet}).close()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        text = err.str() if err is not None and hasattr(err, "str") else str(exc)
        for key, value in props.items():
            if SECRET_KAFKA_KEYS.search(key) and value:
                text = text.replace(value, MASK)
        named = re.search(r'property:? "?([A-Za-z0-9._]+)"?', text)
        what = f"{named.group(1)!r}: " if named else ""
        raise ConfigError(
            _setting(path), f"{what}{text.removeprefix('Failed to create consumer: ')}"
        ) from None
    except ValueError as exc:  # confluent-kafka's own checks (e.g. a value of the wrong type)
        raise ConfigError(_setting(path), str(exc)) from None


def read_properties(path: str | os.PathLike[str]) -> KafkaProperties:
    """Read and check a Kafka client properties file (see the module's docstring)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            _setting(file), "does not exist: give the path of a key=value properties file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(_setting(file), f"cannot be read ({reason})") from None
    props = _parse(file, text)
    for key in props:
        if key in MANAGED:
            raise ConfigError(
                _setting(file),
                f"{key!r} is managed by txn_offsets (offsets live in PostgreSQL): remove it from the file",
            )
        if key in _JAVA_ONLY:
            raise ConfigError(
                _setting(file),
                f"{key!r} is a Java client property librdkafka does not take: {_JAVA_ONLY[key]}",
            )
    bootstrap = props.pop("bootstrap.servers", None)
    _check_with_librdkafka(file, props)
    return KafkaProperties(
        path=file,
        bootstrap=bootstrap,
        properties={k: Secret(v) if SECRET_KAFKA_KEYS.search(k) else v for k, v in props.items()},
    )
