"""Issue 42, item 9: a connection beyond loopback without verified TLS (PostgreSQL: sslmode other
than verify-full / verify-ca; Kafka: not SSL / SASL_SSL, or certificate or name checks off) is one
warning per process naming the setting to change, never a password; TXN_OFFSETS_REQUIRE_TLS=1
refuses it (ConfigError). Loopback (127.0.0.0/8, ::1, localhost) and Unix sockets stay quiet.

Only engines and clients are created here (neither connects); the real connections are in
tests/integration/test_security_settings.py."""

from __future__ import annotations

import logging

import pytest

from txn_offsets import config
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.clients import client_config
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for

PASSWORD = "pw-tls-Secret-42"


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test as a new process: nothing warned yet, no TXN_OFFSETS_REQUIRE_TLS, no PG* defaults."""
    if hasattr(config, "_tls_warned"):
        monkeypatch.setattr(config, "_tls_warned", {})
    for name in ("TXN_OFFSETS_REQUIRE_TLS", "PGSSLMODE", "PGHOST", "PGHOSTADDR", "PGSSLROOTCERT"):
        monkeypatch.delenv(name, raising=False)


def _db(query: str = "", host: str = "db.example.com") -> DatabaseSettings:
    return DatabaseSettings(Secret(f"postgresql+psycopg://app:{PASSWORD}@{host}:5432/offsets{query}"))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- PostgreSQL


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("", "no sslmode"),
        ("?sslmode=disable", "sslmode=disable"),
        ("?sslmode=prefer", "sslmode=prefer"),
        ("?sslmode=require", "sslmode=require"),  # encrypted, but anyone's certificate will do
    ],
)
def test_postgres_without_verified_tls_warns_once_naming_sslmode(
    caplog: pytest.LogCaptureFixture, query: str, shown: str
) -> None:
    caplog.set_level(logging.WARNING)
    for _ in range(3):  # three engines in one process: one warning
        engine_for(_db(query)).dispose()
    (warning,) = _warnings(caplog)
    assert "PostgreSQL at db.example.com" in warning and shown in warning
    assert "sslmode=verify-full" in warning and "TXN_OFFSETS_REQUIRE_TLS=1" in warning
    assert PASSWORD not in warning and "\n" not in warning


@pytest.mark.parametrize("query", ["", "?sslmode=disable", "?sslmode=require"])
def test_require_tls_refuses_postgres_without_verified_tls(
    monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    with pytest.raises(ConfigError) as info:
        engine_for(_db(query))
    text = str(info.value)
    assert info.value.setting == "sslmode"
    assert "db.example.com" in text and "sslmode=verify-full" in text and "TXN_OFFSETS_REQUIRE_TLS=1" in text
    assert PASSWORD not in text and "\n" not in text


@pytest.mark.parametrize(
    "query",
    [
        "?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem",
        "?sslmode=verify-ca&sslrootcert=/etc/ssl/ca.pem",
        "?sslrootcert=system",  # libpq >= 16: verify-full
    ],
)
def test_verified_postgres_is_quiet_and_allowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, query: str
) -> None:
    caplog.set_level(logging.WARNING)
    engine_for(_db(query)).dispose()
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    engine_for(_db(query)).dispose()
    assert _warnings(caplog) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_is_quiet_even_when_tls_is_required(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, host: str
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    engine_for(_db("?sslmode=disable", host=host)).dispose()
    assert _warnings(caplog) == []


def test_unix_sockets_are_local(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    engine_for(DatabaseSettings("postgresql+psycopg://app:pw@/offsets?host=/var/run/postgresql")).dispose()
    engine_for(DatabaseSettings("postgresql+psycopg://app:pw@/offsets")).dispose()  # the default socket
    assert _warnings(caplog) == []


def test_every_host_of_a_multi_host_url_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    multi = "postgresql+psycopg://app:pw@/offsets?host=127.0.0.1:5432&host=replica.example.com:5433"
    with pytest.raises(ConfigError, match=r"PostgreSQL at replica\.example\.com is reached"):
        engine_for(DatabaseSettings(multi))


def test_the_libpq_environment_and_connect_args_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    engine_for(_db()).dispose()  # libpq takes PGSSLMODE when the URL says nothing
    with pytest.raises(ConfigError, match="sslmode=disable"):
        engine_for(_db(), connect_args={"sslmode": "disable"})  # connect_args win over all


def test_a_bad_require_tls_value_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "always")
    with pytest.raises(ConfigError, match=r"^TXN_OFFSETS_REQUIRE_TLS: 'always': use 1 .* or 0"):
        engine_for(_db("?sslmode=verify-full"))


# -- Kafka


@pytest.mark.parametrize(
    ("props", "setting"),
    [
        ({}, "security.protocol"),
        ({"security.protocol": "PLAINTEXT"}, "security.protocol"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.password": PASSWORD}, "security.protocol"),
        (
            {"security.protocol": "SASL_SSL", "enable.ssl.certificate.verification": "false"},
            "enable.ssl.certificate.verification",
        ),
        (
            {"security.protocol": "SSL", "enable.ssl.certificate.verification": False},
            "enable.ssl.certificate.verification",
        ),
        (
            {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"},
            "ssl.endpoint.identification.algorithm",
        ),
    ],
)
def test_kafka_without_verified_tls_warns_once_or_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, props: dict[str, object], setting: str
) -> None:
    caplog.set_level(logging.WARNING)
    base = {
        "bootstrap.servers": "127.0.0.1:9092,broker-1.example.com:9093",
        **props,
        "sasl.password": PASSWORD,
    }
    for _ in range(3):
        client_config(base)
    (warning,) = _warnings(caplog)
    assert "Kafka at broker-1.example.com:9093" in warning and setting in warning
    assert "127.0.0.1" not in warning and PASSWORD not in warning

    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    with pytest.raises(ConfigError) as info:
        client_config(base)
    assert info.value.setting == setting and PASSWORD not in str(info.value)
    assert "TXN_OFFSETS_REQUIRE_TLS=1" in str(info.value)


@pytest.mark.parametrize(
    "base",
    [
        {"bootstrap.servers": "broker-1.example.com:9093", "security.protocol": "SASL_SSL"},
        {"bootstrap.servers": "broker-1.example.com:9093", "security.protocol": "ssl"},
        {"bootstrap.servers": "127.0.0.1:9092"},  # the local stack's plaintext listener
        {"bootstrap.servers": "localhost:9092,[::1]:9092,127.0.0.2:9092"},
    ],
)
def test_verified_or_loopback_kafka_is_quiet(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, base: dict[str, str]
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("TXN_OFFSETS_REQUIRE_TLS", "1")
    assert client_config(base)["bootstrap.servers"] == base["bootstrap.servers"]
    assert _warnings(caplog) == []


def test_postgres_and_kafka_each_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    engine_for(_db()).dispose()
    client_config({"bootstrap.servers": "broker-1.example.com:9092"})
    engine_for(_db("", host="other.example.com")).dispose()
    client_config({"bootstrap.servers": "broker-2.example.com:9092"})
    assert [w.split(" at ")[0] for w in _warnings(caplog)] == ["PostgreSQL", "Kafka"]
