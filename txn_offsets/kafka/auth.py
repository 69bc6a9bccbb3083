"""Kafka refusing the client's credentials or not proving its own identity: a SASL login refused
or a broker certificate that does not verify is a :class:`~txn_offsets.errors.ConfigError` naming
the setting to fix (``sasl.username``/``sasl.password``, ``ssl.ca.location``), not "no answer".

librdkafka retries such a connection forever and reports why only through ``error_cb``:
:func:`error_cb` records it per client, :func:`raise_if_refused` turns it into the error once the
client gave up. librdkafka's text names the mechanism and the state, never a secret.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import KafkaError

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError

__all__ = ["error_cb", "raise_if_refused"]

_REFUSED = (KafkaError._AUTHENTICATION, KafkaError._SSL)
_seen: dict[str, KafkaError] = {}
_lock = threading.Lock()


def error_cb(key: str) -> Callable[[KafkaError], None]:
    """An ``error_cb`` for the client cached under `key`: remembers its last refusal."""

    def record(err: KafkaError) -> None:
        if err.code() in _REFUSED:
            with _lock:
                _seen[key] = err

    return record


def raise_if_refused(kafka: KafkaSettings, key: str) -> None:
    """Raise the ConfigError for the refusal recorded for `key` (then forgotten), if any."""
    with _lock:
        err = _seen.pop(key, None)
    if err is None:
        return
    where = f"Kafka at {kafka.bootstrap_servers}"
    said = err.str()
    if err.code() == KafkaError._AUTHENTICATION:
        user = kafka.extra.get("sasl.username")
        mechanism = kafka.extra.get("sasl.mechanism", kafka.extra.get("sasl.mechanisms", "SASL"))
        raise ConfigError(
            "sasl.username/sasl.password",
            f"{where} refused the {mechanism} login of user {user!r} ({said}); check the user and "
            f"password in the Kafka properties (--kafka-config / TXN_OFFSETS_KAFKA_CONFIG)",
        )
    raise ConfigError(
        "ssl.ca.location",
        f"the TLS handshake with {where} failed ({said}); give the CA certificate that signed the "
        f"broker's certificate (a PEM file) in the Kafka properties",
    )
