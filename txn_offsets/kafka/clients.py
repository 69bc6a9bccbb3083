"""What every Kafka client the library creates shares: librdkafka's own log through Python logging,
and a :class:`~txn_offsets.kafka.causes.Witness` of its failed connections.

Left alone, librdkafka writes each of its log lines to stderr itself: with Kafka down, a command
printed ~190 ``%3|...|FAIL|`` lines before its one-line error, and ``serve`` as many in 10 s.
:func:`client_config` gives every Producer, Consumer and AdminClient a Witness as its ``logger``
and ``error_cb``: the lines go to the logger ``txn_offsets.kafka.librdkafka`` - a failed
connection at INFO (the error that follows names its cause: :mod:`txn_offsets.kafka.causes`;
``-v`` shows the lines), librdkafka's warnings at WARNING at most, its info lines at DEBUG - and
librdkafka makes lines up to info (``log_level`` 6: a listener of another protocol closing the
connection is only an info line). A :class:`Deduplicate` filter passes the first line of each kind
and drops the same kind for :data:`WINDOW_S` seconds (a reconnect loop repeats one line every few
ms), then passes it again with the number of lines it dropped.

A consumer's or producer's lines are served by its ``poll``; an AdminClient's by
:func:`serve_logs` (the metadata module calls it).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from txn_offsets.config import KafkaSettings, check_kafka_tls
from txn_offsets.kafka.causes import Witness

__all__ = [
    "LOGGER_NAME",
    "WINDOW_S",
    "Deduplicate",
    "client_config",
    "serve_logs",
    "settings_key",
    "witness_for",
]

LOGGER_NAME = "txn_offsets.kafka.librdkafka"
WINDOW_S = 60.0
_LOG_LEVEL = 6  # librdkafka's syslog levels: 3 error, 4 warning, 6 info; 7 (debug) stays unmade

# what differs between two lines of the same kind: the client's name, timings, counts
_VARYING = re.compile(r"rdkafka#\w+-\d+|\(after \d+ms|\d+ identical error\(s\) suppressed|\d+ms")


class Deduplicate(logging.Filter):
    """Pass each kind of line once per `window_s` (thread-safe); records above WARNING are
    lowered to WARNING."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (when passed, dropped since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        args = record.args if isinstance(record.args, tuple) else ()
        # confluent-kafka logs ("%s [%s] %s", facility, client name, message): the name differs
        # per client, so a new client after a failure repeats the same kind of line
        text = f"{args[0]} {args[2]}" if len(args) == 3 else record.getMessage()
        kind = _VARYING.sub("", text)
        now = time.monotonic()
        with self._lock:
            passed, dropped = self._seen.get(kind, (float("-inf"), 0))
            if now - passed < self.window_s:
                self._seen[kind] = (passed, dropped + 1)
                return False
            self._seen[kind] = (now, 0)
            if len(self._seen) > 1000:  # kinds are few; bound the memory anyway
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
        if dropped:
            record.msg = f"{record.msg} (and {dropped} like it in the last {self.window_s:g}s)"
        return True


_logger = logging.getLogger(LOGGER_NAME)
_logger.addFilter(Deduplicate())


def settings_key(kafka: KafkaSettings, *more: object) -> str:
    """What a process keeps its clients and connections for one Kafka's settings under: every
    client setting (passwords too: a key is never logged), the isolation level, and `more`."""
    return repr((sorted(kafka.client_config().items()), kafka.isolation_level, *more))


def client_config(base: Mapping[str, Any], witness: Witness | None = None) -> dict[str, Any]:
    """`base` plus a Witness as ``logger`` and ``error_cb`` (`witness`, for a caller that asks it
    why the client got no answer; else a new one) and ``log_level`` (`base`'s own values win).

    Brokers beyond loopback without verified TLS (SSL / SASL_SSL with certificate and name checks)
    are warned about once per process, or refused (ConfigError) under ``TXN_OFFSETS_REQUIRE_TLS=1``:
    :func:`txn_offsets.config.check_kafka_tls`."""
    check_kafka_tls(base)
    seen = witness if witness is not None else witness_for(base)
    return {"logger": seen, "error_cb": seen.error, "log_level": _LOG_LEVEL, **base}


def witness_for(base: Mapping[str, Any]) -> Witness:
    """A new Witness for a client made of `base`, handing its lines to the shared logger."""
    return Witness(base, _logger)


def serve_logs(client: Any) -> None:
    """Hand the log lines an AdminClient queued to logging (it has no poll loop of its own)."""
    with contextlib.suppress(Exception):  # a closed or broken client has nothing to serve
        client.poll(0)
