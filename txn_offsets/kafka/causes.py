"""Why a Kafka client got no answer, in the one line of its error: librdkafka's own account of each
failed connection (refused, a host name that does not resolve, a TLS handshake that failed, a
listener of another protocol, a SASL login refused), seen by a :class:`Witness` per client.

librdkafka retries a broker connection forever and says why only in its log and its ``error_cb``:
the request itself just times out ("no answer in 4s" for a closed port, a typo in the host and a
TLS client at a PLAINTEXT port alike). A Witness is a client's ``logger`` and ``error_cb``: it
keeps, per broker, the most telling failure it saw, and :meth:`Witness.why` turns it into the
error a caller raises - :class:`~txn_offsets.errors.ServiceUnavailable` naming the cause, or a
:class:`~txn_offsets.errors.ConfigError` naming the setting to fix for a refused login
(``sasl.username``/``sasl.password``) or a broker certificate that does not verify
(``ssl.ca.location``). The lines themselves go on to Python logging: a connection failure at INFO
(the error says it; ``-v`` shows them), librdkafka's other warnings as warnings. librdkafka's texts
name hosts, ports, mechanisms and states, never a secret; the user name comes from the settings,
the password never does.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from txn_offsets.errors import ConfigError, ServiceUnavailable, TxnOffsetsError

__all__ = ["Failure", "Witness", "explain"]

# "[thrd:ssl://h:9093/bootstrap]: ssl://h:9093/bootstrap: <what> (after 3ms in state SSL_HANDSHAKE)"
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_BROKER = re.compile(r"^(?:[a-z_]+://)?(?P<broker>[^\s/]+)/[\w-]+: ")
_AFTER = re.compile(
    r"(?: \(after (?P<ms>\d+)ms in state (?P<state>\w+)(?:, \d+ identical error\(s\) suppressed)?\))?"
    r"(?: \(_\w+\))?$"
)
_RESOLVE = re.compile(r"Failed to resolve '(?P<target>[^']*)': (?P<why>.+)")
_HANDSHAKE = re.compile(r"SSL handshake failed: (?P<why>.+)")
_PLAINTEXT_LISTENER = "connecting to a PLAINTEXT broker listener?"
_CLOSED = "connection closed by peer"
_SIZE = re.compile(r"Invalid response size (?P<size>-?\d+)")
_SOON_MS = 5000  # a listener that closes a connection this soon after it opened refuses its protocol
# what to give instead, per security.protocol, when a listener closes the connection at once
_OTHER_PROTOCOLS = {
    "PLAINTEXT": "a TLS listener needs SSL or SASL_SSL with ssl.ca.location, a SASL one SASL_PLAINTEXT",
    "SSL": "a SASL listener needs SASL_SSL with sasl.mechanism, sasl.username and sasl.password",
    "SASL_PLAINTEXT": "a TLS listener needs SASL_SSL with ssl.ca.location, one without SASL PLAINTEXT",
    "SASL_SSL": "a listener without SASL needs SSL",
}
# the facilities of librdkafka's lines about a failed broker connection
_FAILURE_FACILITIES = {"FAIL", "ERROR"}
_KEPT_PER_BROKER = 5  # the latest failure of each rank (1-5); the best of each broker is what is said
_NAMED = 2  # the rank from which a failure names its cause (refused, unresolved, another protocol)


@dataclass(frozen=True)
class Failure:
    """One failed connection in our words: `rank` orders how much it tells (a refusal that names the
    setting to fix, 5, down to librdkafka's own text, 1); `setting` is set for a refusal."""

    broker: str
    rank: int
    said: str
    setting: str | None = None


def _host(target: str) -> str:
    """The host of ``host:port`` (a bracketed IPv6 address without its brackets)."""
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 or target.startswith("[") else target
    return host.strip("[]")


@dataclass(frozen=True)
class _Line:
    """One librdkafka text about a broker connection, taken apart."""

    broker: str
    body: str  # without the thread, the broker and the "(after 3ms in state X)"
    state: str | None
    took_ms: int | None  # in that state
    protocol: str
    code: int | None


def _refused(line: _Line) -> Failure | None:
    """Kafka refusing the client (a login) or the client refusing Kafka (its certificate)."""
    if line.code == KafkaError._AUTHENTICATION or "SASL authentication error" in line.body:
        return Failure(line.broker, 5, line.body, "sasl.username/sasl.password")
    if "certificate verify failed" in line.body:
        return Failure(line.broker, 5, line.body, "ssl.ca.location")
    return None


def _nobody(line: _Line) -> Failure | None:
    """Nothing at the address: no listener on the port, or a host name that does not resolve."""
    if "Connection refused" in line.body:
        return Failure(line.broker, 2, f"connection refused by {line.broker} (nothing listens there)")
    resolve = _RESOLVE.search(line.body)
    if resolve is not None:
        host = _host(resolve.group("target"))
        return Failure(line.broker, 2, f"name resolution failed for host {host!r} ({resolve.group('why')})")
    return None


def _other_protocol(line: _Line) -> Failure | None:
    """Something listens, but not in the protocol the client speaks (TLS or not, SASL or not, Kafka
    or not)."""
    broker, protocol = line.broker, line.protocol
    if _PLAINTEXT_LISTENER in line.body:
        return Failure(
            broker,
            4,
            f"SSL handshake with {broker} failed: it is a PLAINTEXT listener (security.protocol="
            f"{protocol}: give the port of the broker's TLS listener, or the protocol this one speaks)",
        )
    handshake = _HANDSHAKE.search(line.body)
    if handshake is not None or line.code == KafkaError._SSL:
        why = handshake.group("why") if handshake is not None else line.body
        return Failure(broker, 3, f"SSL handshake with {broker} failed ({why})")
    size = _SIZE.search(line.body)
    if size is not None:
        head = int(size.group("size")).to_bytes(4, "big", signed=True)
        shown = f" (its answer starts with {head.decode()!r})" if head.isascii() and head.isalpha() else ""
        return Failure(
            broker, 3, f"{broker} does not answer in Kafka's protocol{shown}: another service listens there"
        )
    if _CLOSED in line.body and line.state == "SSL_HANDSHAKE":
        return Failure(
            broker,
            3,
            f"{broker} closed the connection in the SSL handshake: a PLAINTEXT listener? "
            f"(security.protocol={protocol}: give the port of the broker's TLS listener)",
        )
    if _CLOSED in line.body and line.took_ms is not None and line.took_ms < _SOON_MS:
        other = _OTHER_PROTOCOLS.get(protocol, "check it against the listener's")
        return Failure(
            broker,
            3,
            f"{broker} closed the connection without answering: wrong protocol? "
            f"(security.protocol={protocol}; {other})",
        )
    return None


_RULES = (_refused, _nobody, _other_protocol)


def explain(text: str, *, protocol: str = "PLAINTEXT", code: int | None = None) -> Failure | None:
    """librdkafka's text of a failed connection (a log line's or an ``error_cb`` error's) in our
    words, or None for a text about no broker connection (``1/1 brokers are down``)."""
    body = _THREAD.sub("", text.strip())
    prefix = _BROKER.match(body)
    if prefix is None:
        return None
    body = body[prefix.end() :]
    after = _AFTER.search(body)
    took = after.group("ms") if after is not None else None
    line = _Line(
        broker=prefix.group("broker"),
        body=body[: after.start()] if after is not None else body,
        state=after.group("state") if after is not None else None,
        took_ms=int(took) if took else None,
        protocol=protocol.upper(),
        code=code,
    )
    for rule in _RULES:
        found = rule(line)
        if found is not None:
            return found
    return Failure(line.broker, 1, f"{line.broker}: {line.body}")


class Witness:
    """The ``logger`` and ``error_cb`` of one Kafka client (thread-safe): remembers its connection
    failures and hands every log line on to `forward` - a connection failure at INFO (the error
    that follows names it), librdkafka's other info lines at DEBUG, its warnings and errors as such."""

    def __init__(self, config: Mapping[str, Any], forward: logging.Logger) -> None:
        self.bootstrap = str(config.get("bootstrap.servers", ""))
        self.protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
        self._user = config.get("sasl.username")
        self._mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms", "SASL"))
        self._forward = forward
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int], tuple[float, Failure]] = {}  # (broker, rank) -> latest

    def log(self, level: int, msg: str, *args: object) -> None:
        """confluent-kafka's call: ``log(level, "%s [%s] %s", facility, client name, text)``."""
        failure = None
        if len(args) == 3 and args[0] in _FAILURE_FACILITIES:
            failure = explain(str(args[2]), protocol=self.protocol)
        if failure is not None:
            self._remember(failure)
            level = min(level, logging.INFO)
        elif level < logging.WARNING:  # librdkafka's info lines: its debug, to us
            level = logging.DEBUG
        self._forward.log(level, msg, *args)

    def error(self, err: KafkaError) -> None:
        """The ``error_cb``: the same failures as the log lines, with their codes."""
        failure = explain(err.str(), protocol=self.protocol, code=err.code())
        if failure is not None:
            self._remember(failure)
        self._forward.debug("error_cb: %s: %s", err.name(), err.str())

    def _remember(self, failure: Failure) -> None:
        with self._lock:
            self._seen[(failure.broker, failure.rank)] = (time.monotonic(), failure)
            if len(self._seen) > 64 * _KEPT_PER_BROKER:  # a list of many brokers: keep it bounded
                oldest = min(self._seen, key=lambda k: self._seen[k][0])
                del self._seen[oldest]

    def failures(self, within_s: float) -> list[Failure]:
        """Per broker, the most telling failure seen in the last `within_s` seconds."""
        now = time.monotonic()
        best: dict[str, tuple[int, float, Failure]] = {}
        with self._lock:
            for (broker, rank), (when, failure) in self._seen.items():
                if now - when <= within_s and (rank, when) > best.get(broker, (0, 0.0, failure))[:2]:
                    best[broker] = (rank, when, failure)
        return [best[b][2] for b in sorted(best)]

    def failed_all(self, brokers: Iterable[str], within_s: float) -> bool:
        """Whether each of `brokers` (``host:port``, a ``scheme://`` ignored) failed in a way that
        names its cause (not librdkafka's bare text) in the last `within_s` seconds."""
        named = {f.broker for f in self.failures(within_s) if f.rank >= _NAMED}
        wanted = {b.strip().rsplit("://", 1)[-1] for b in brokers if b.strip()}
        return bool(wanted) and wanted <= named

    def why(self, within_s: float, fallback: str, *, refusals: bool = False) -> TxnOffsetsError:
        """The error for a call that got no answer: ServiceUnavailable naming each broker's failure
        seen in the last `within_s` seconds, or saying `fallback` ("no answer in 4s") when
        librdkafka reported none. With `refusals` (a first contact: these settings never got an
        answer) a refused login or certificate is a ConfigError naming the setting instead; later
        one may be passing (a certificate or password being rotated): it stays ServiceUnavailable,
        retried like any other."""
        refused = [f for f in self.failures(within_s) if f.setting is not None]
        if refused and refusals:
            return self._refusal(refused[0])
        return ServiceUnavailable("Kafka", self.bootstrap, self.said(within_s) or fallback)

    def said(self, within_s: float) -> str:
        """The failures of the last `within_s` seconds in one phrase ("" for none)."""
        seen = self.failures(within_s)
        phrases = (f"{f.broker}: {f.said}" if f.setting is not None else f.said for f in seen[:3])
        said = "; ".join(dict.fromkeys(phrases))
        return said + (f" (and {len(seen) - 3} more broker(s))" if len(seen) > 3 else "")

    def _refusal(self, failure: Failure) -> ConfigError:
        where = f"Kafka at {self.bootstrap}"
        if failure.setting == "ssl.ca.location":
            return ConfigError(
                "ssl.ca.location",
                f"the TLS handshake with {where} failed ({failure.said}); give the CA certificate "
                f"that signed the broker's certificate (a PEM file) in the Kafka properties",
            )
        return ConfigError(
            "sasl.username/sasl.password",
            f"{where} refused the {self._mechanism} login of user {self._user!r} ({failure.said}); "
            f"check the user and password in the Kafka properties (--kafka-config / "
            f"TXN_OFFSETS_KAFKA_CONFIG)",
        )
