"""librdkafka's account of a failed connection in our words (txn_offsets.kafka.causes): the texts
below are librdkafka 2.16's own, as a client on the stack logged them."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.errors import ConfigError, ServiceUnavailable
from txn_offsets.kafka.causes import Witness, explain

REFUSED = (
    "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
    "Connection refused (after 0ms in state CONNECT)"
)
RESOLVE = (
    "no-such-host.invalid:9092/bootstrap: Failed to resolve 'no-such-host.invalid:9092': Name or "
    "service not known (after 1ms in state CONNECT)"
)
SSL_AT_PLAINTEXT = (
    "ssl://127.0.0.1:47003/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: "
    "connecting to a PLAINTEXT broker listener? (after 11ms in state SSL_HANDSHAKE)"
)
SSL_CLOSED = (
    "ssl://127.0.0.1:47003/bootstrap: Disconnected: SSL connection closed by peer "
    "(after 1ms in state SSL_HANDSHAKE)"
)
PLAINTEXT_AT_TLS = (
    "127.0.0.1:46087/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN "
    "(after 0ms in state APIVERSION_QUERY)"
)
IDLE_CLOSE = (
    "127.0.0.1:46087/1: Disconnected: connection closed by peer: receive 0 after POLLIN "
    "(after 600001ms in state UP)"
)
SASL = (
    "sasl_ssl://127.0.0.1:46087/bootstrap: SASL authentication error: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
    "(after 335ms in state AUTH_REQ)"
)
CERT = (
    "ssl://127.0.0.1:46087/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
    "verify failed: broker certificate could not be verified (after 3ms in state SSL_HANDSHAKE)"
)
HTTP = (
    "127.0.0.1:1/bootstrap: Receive failed: Invalid response size 1213486160 (0..100000000): increase "
    "receive.message.max.bytes (after 2ms in state APIVERSION_QUERY)"
)


@pytest.mark.parametrize(
    ("text", "protocol", "rank", "said"),
    [
        (REFUSED, "PLAINTEXT", 2, "connection refused by 127.0.0.1:1 (nothing listens there)"),
        (
            RESOLVE,
            "PLAINTEXT",
            2,
            "name resolution failed for host 'no-such-host.invalid' (Name or service not known)",
        ),
        (SSL_AT_PLAINTEXT, "SSL", 4, "SSL handshake with 127.0.0.1:47003 failed: it is a PLAINTEXT listener"),
        (
            SSL_CLOSED,
            "SSL",
            3,
            "127.0.0.1:47003 closed the connection in the SSL handshake: a PLAINTEXT listener?",
        ),
        (PLAINTEXT_AT_TLS, "PLAINTEXT", 3, "closed the connection without answering: wrong protocol?"),
        (PLAINTEXT_AT_TLS, "SSL", 3, "a SASL listener needs SASL_SSL"),
        (HTTP, "PLAINTEXT", 3, "does not answer in Kafka's protocol (its answer starts with 'HTTP')"),
        (IDLE_CLOSE, "PLAINTEXT", 1, "127.0.0.1:46087: Disconnected: connection closed by peer"),
    ],
)
def test_each_failure_in_our_words(text: str, protocol: str, rank: int, said: str) -> None:
    failure = explain(text, protocol=protocol)
    assert failure is not None
    assert (failure.rank, failure.setting) == (rank, None)
    assert said in failure.said and "(after " not in failure.said, failure.said


@pytest.mark.parametrize(
    ("text", "setting"), [(SASL, "sasl.username/sasl.password"), (CERT, "ssl.ca.location")]
)
def test_refusals_name_the_setting(text: str, setting: str) -> None:
    failure = explain(text, protocol="SASL_SSL")
    assert failure is not None and failure.setting == setting and failure.rank == 5


def test_texts_about_no_broker_are_no_failure() -> None:
    assert explain("1/1 brokers are down") is None
    assert explain("Failed while waiting for controller: Local: Timed out") is None


@given(st.text(max_size=300), st.sampled_from(["PLAINTEXT", "SSL", "sasl_ssl", "?"]))
def test_explain_never_raises(text: str, protocol: str) -> None:
    failure = explain(text, protocol=protocol)
    assert failure is None or failure.said


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def forward() -> logging.Logger:
    logger = logging.getLogger("test.kafka.causes")
    logger.handlers[:] = [_Lines()]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger


def _witness(forward: logging.Logger, **config: str) -> Witness:
    return Witness({"bootstrap.servers": "127.0.0.1:1", **config}, forward)


def test_a_failure_line_goes_on_at_info_other_lines_as_they_were(forward: logging.Logger) -> None:
    witness = _witness(forward)
    witness.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)
    witness.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "a property is ignored")
    witness.log(logging.INFO, "%s [%s] %s", "CLUSTERID", "rdkafka#producer-1", "cluster id changed")
    records = forward.handlers[0].records  # type: ignore[attr-defined]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING, logging.DEBUG]
    assert records[0].getMessage().startswith("FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]")


def test_why_names_each_brokers_best_failure(forward: logging.Logger) -> None:
    witness = _witness(forward, **{"bootstrap.servers": "127.0.0.1:47003,no-such-host.invalid:9092"})
    witness.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", SSL_CLOSED)
    witness.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", SSL_AT_PLAINTEXT)
    witness.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", SSL_CLOSED)  # later, less telling
    witness.error(KafkaError(KafkaError._RESOLVE, RESOLVE))
    error = witness.why(5.0, "no answer in 4s")
    assert isinstance(error, ServiceUnavailable)
    assert error.detail == (
        "SSL handshake with 127.0.0.1:47003 failed: it is a PLAINTEXT listener (security.protocol="
        "PLAINTEXT: give the port of the broker's TLS listener, or the protocol this one speaks); "
        "name resolution failed for host 'no-such-host.invalid' (Name or service not known)"
    )


def test_why_without_a_failure_in_the_window_says_the_fallback(forward: logging.Logger) -> None:
    witness = _witness(forward)
    assert witness.why(5.0, "no answer in 4s").detail == "no answer in 4s"  # type: ignore[attr-defined]
    witness.error(KafkaError(KafkaError._TRANSPORT, REFUSED))
    assert "connection refused by 127.0.0.1:1" in str(witness.why(5.0, "no answer in 4s"))
    assert witness.why(-1.0, "no answer in 4s").detail == "no answer in 4s"  # type: ignore[attr-defined]


def test_a_refused_login_is_a_config_error_without_the_password(forward: logging.Logger) -> None:
    witness = _witness(
        forward,
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "app",
            "sasl.password": "hunter2-secret",
        },
    )
    witness.error(KafkaError(KafkaError._AUTHENTICATION, SASL))
    witness.error(KafkaError(KafkaError._TRANSPORT, REFUSED))
    later = witness.why(5.0, "no answer in 4s")  # not a first contact: retried as any other
    assert isinstance(later, ServiceUnavailable)
    assert "127.0.0.1:46087: SASL authentication error: Authentication failed" in later.detail, later
    error = witness.why(5.0, "no answer in 4s", refusals=True)
    assert isinstance(error, ConfigError)
    text = str(error)
    assert text.startswith(
        "sasl.username/sasl.password: Kafka at 127.0.0.1:1 refused the SCRAM-SHA-512 login"
    )
    assert "user 'app'" in text and "hunter2" not in text and "hunter2" not in repr(vars(witness))


def test_an_unverified_certificate_asks_for_the_ca(forward: logging.Logger) -> None:
    witness = _witness(forward, **{"security.protocol": "SSL"})
    witness.error(KafkaError(KafkaError._SSL, CERT))
    error = witness.why(5.0, "no answer in 4s", refusals=True)
    assert isinstance(error, ConfigError) and str(error).startswith("ssl.ca.location: the TLS handshake")
