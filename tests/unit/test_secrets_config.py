"""Settings that hold secrets never show them; database timeouts are validated and reach libpq."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import URL

from txn_offsets import ConfigError, SchemaMissing, ServiceUnavailable
from txn_offsets.config import DatabaseSettings, KafkaSettings, validate_identifier
from txn_offsets.redaction import Secret, redact_url
from txn_offsets.store.database import (
    engine_for,
    is_connection_lost,
    is_lock_timeout,
    is_retryable,
    is_statement_timeout,
    translate_errors,
)
from txn_offsets.store.pooler import half_open_s, lacking

SECRET_QUERY_KEYS = ["password", "sslpassword", "SSLPassword", "client_secret", "access_token", "X-TOKEN"]
# a prefix that appears nowhere else in the rendered settings, so "not in" really means "not shown"
secrets = st.text(min_size=0, max_size=40).map(lambda s: "Zq7" + s)


class _FakeDriverError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _dbapi(cls: type[sa.exc.DBAPIError], message: str, sqlstate: str | None) -> sa.exc.DBAPIError:
    return cls("SELECT 1", {}, _FakeDriverError(message, sqlstate))


def _shown(db: DatabaseSettings) -> list[str]:
    return [repr(db), str(db), db.display_url, redact_url(db.url), redact_url(db.url.render_as_string(False))]


# --- secrets in the database URL -------------------------------------------------------------


@pytest.mark.parametrize("key", SECRET_QUERY_KEYS)
def test_secret_query_parameters_are_redacted(key: str) -> None:
    raw = f"postgresql+psycopg://u@db.example/x?{key}=hunter2&sslmode=require"
    db = DatabaseSettings(raw)
    for text in [*_shown(db), redact_url(raw)]:
        assert "hunter2" not in text
        assert f"{key}=***" in text
        assert "sslmode=require" in text  # other parameters stay visible


def test_userinfo_and_query_passwords_are_both_redacted() -> None:
    db = DatabaseSettings(Secret("postgresql+psycopg://u:pw-user@h/x?sslpassword=pw-ssl&password=pw-q"))
    for text in _shown(db):
        assert "pw-" not in text
        assert "u:***@h" in text


def test_repeated_secret_query_parameters_are_all_redacted() -> None:
    raw = "postgresql+psycopg://u@h/x?token=first-tok&token=second-tok"
    db = DatabaseSettings(raw)
    for text in [*_shown(db), redact_url(raw)]:
        assert "-tok" not in text
    assert set(db.secret_values()) == {"first-tok", "second-tok"}


def test_secret_values_lists_every_secret_and_nothing_else() -> None:
    db = DatabaseSettings(
        "postgresql+psycopg://u:pw@h/x?sslpassword=ssl-pw&application_name=app&api_token=tk&password="
    )
    assert set(db.secret_values()) == {"pw", "ssl-pw", "tk"}  # the empty value is no secret
    assert DatabaseSettings("postgresql+psycopg://u@h/x").secret_values() == ()
    # longest first: scrubbing in this order never leaves part of a longer secret behind
    lengths = [len(v) for v in db.secret_values()]
    assert lengths == sorted(lengths, reverse=True)


@given(password=secrets, query_secret=secrets, key=st.sampled_from(SECRET_QUERY_KEYS))
def test_no_secret_is_ever_shown(password: str, query_secret: str, key: str) -> None:
    url = URL.create(
        "postgresql+psycopg",
        username="u",
        password=password,
        host="h",
        database="x",
        query={key: query_secret, "application_name": "app"},
    )
    db = DatabaseSettings(url)
    assert set(db.secret_values()) == {password, query_secret}
    for text in _shown(db):
        for secret in (password, query_secret):
            assert secret not in text
            assert quote_plus(secret) not in text


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "garbage",
        "://",
        "postgresql://u:pw@h:notaport/x",
        "x://u:p@[::1",
        None,
        42,
        b"postgresql://u:p@h/x",
    ],
)
def test_redact_url_never_raises_and_shows_nothing_of_garbage(garbage: Any) -> None:
    shown = redact_url(garbage)
    assert isinstance(shown, str)
    assert "pw" not in shown


@given(st.text())
def test_redact_url_never_raises(text: str) -> None:
    assert isinstance(redact_url(text), str)


def test_a_non_numeric_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="database_url") as info:
        DatabaseSettings("postgresql+psycopg://u:pw-port@h:notaport/x")
    assert "pw-port" not in str(info.value)


# --- driver errors are scrubbed of every secret ----------------------------------------------

QUERY_PW_DB = DatabaseSettings(
    Secret("postgresql+psycopg://u@db.invalid:5432/x?password=hunter2"), schema="s1"
)


def test_translate_errors_scrubs_a_query_password() -> None:
    with pytest.raises(ServiceUnavailable) as info, translate_errors(QUERY_PW_DB):
        raise _dbapi(sa.exc.OperationalError, 'password authentication failed: "hunter2"', "28P01")
    assert "hunter2" not in str(info.value)
    assert "password=***" in str(info.value) and "***" in info.value.args[0]


def test_translate_errors_scrubs_every_secret_in_schema_errors_too() -> None:
    db = DatabaseSettings("postgresql+psycopg://u:pw-user@h/x?sslpassword=pw-ssl", schema="s1")
    with pytest.raises(SchemaMissing) as info, translate_errors(db):
        raise _dbapi(sa.exc.ProgrammingError, "no table (pw-user, pw-ssl, pw%2Dssl)", "42P01")
    assert "pw-" not in str(info.value)


@given(secret=secrets, key=st.sampled_from(SECRET_QUERY_KEYS))
def test_translate_errors_never_shows_a_query_secret(secret: str, key: str) -> None:
    db = DatabaseSettings(URL.create("postgresql+psycopg", username="u", host="h", query={key: secret}))
    message = f"failed ({secret}) [{quote(secret, safe='')}] <{quote_plus(secret, safe='')}>"
    with pytest.raises(ServiceUnavailable) as info, translate_errors(db):
        raise _dbapi(sa.exc.OperationalError, message, "08006")
    assert secret not in str(info.value)


# --- Kafka ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.password",
        "sasl.jaas.config",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "ssl_key",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "SASL.OAUTHBEARER.CONFIG",
    ],
)
def test_kafka_repr_masks_secret_properties(key: str) -> None:
    settings = KafkaSettings("k:9092", {key: "principal=svc clientSecret=s3cr3t-value"})
    assert "s3cr3t-value" not in repr(settings)
    assert f"{key!r}: '***'" in repr(settings)
    assert settings.client_config()[key] == "principal=svc clientSecret=s3cr3t-value"  # still used


@pytest.mark.parametrize(
    "key", ["sasl.username", "sasl.mechanism", "ssl.certificate.pem", "ssl.ca.location", "ssl.key.location"]
)
def test_kafka_repr_shows_public_properties(key: str) -> None:
    assert "visible-value" in repr(KafkaSettings("k:9092", {key: "visible-value"}))


# --- identifiers ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc\n", "abc\r\n", "\nabc", "abc\n\n", "a" * 63 + "\n"])
def test_identifier_with_a_newline_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="schema"):
        validate_identifier(value, "schema")
    with pytest.raises(ConfigError, match="schema"):
        DatabaseSettings("postgresql+psycopg://u@h/x", schema=value)


def test_valid_identifiers_still_pass() -> None:
    for value in ["abc", "_x", "a" * 63, "t_0123abcdef"]:
        assert validate_identifier(value, "schema") == value


# --- timeouts ---------------------------------------------------------------------------------

URL_ = "postgresql+psycopg://u@h/x"
SECONDS = ["lock_timeout_s", "statement_timeout_s", "idle_in_transaction_timeout_s", "tcp_user_timeout_s"]
COUNTS = ["tcp_keepalives_idle_s", "tcp_keepalives_interval_s", "tcp_keepalives_count"]


def test_timeout_defaults() -> None:
    db = DatabaseSettings(URL_)
    assert (db.connect_timeout_s, db.lock_timeout_s, db.statement_timeout_s) == (10.0, 30.0, 600.0)
    assert db.idle_in_transaction_timeout_s == 30.0 and db.tcp_user_timeout_s == 20.0
    assert (db.tcp_keepalives_idle_s, db.tcp_keepalives_interval_s, db.tcp_keepalives_count) == (10, 5, 2)
    # a cut-off client is dropped by the server before a retry's claim gives up waiting for its row,
    # and before idle_in_transaction (which is for frozen clients: their kernel answers keepalives)
    assert half_open_s(db) == 20.0 < db.idle_in_transaction_timeout_s <= db.lock_timeout_s


@pytest.mark.parametrize("name", SECONDS)
@pytest.mark.parametrize("value", [-1, -0.001, float("nan"), float("inf"), float("-inf"), 10.0**10])
def test_bad_second_timeouts_are_refused(name: str, value: float) -> None:
    kwargs: dict[str, Any] = {name: value}
    with pytest.raises(ConfigError, match=name) as info:
        DatabaseSettings(URL_, **kwargs)
    assert info.value.setting == name and "seconds" in info.value.problem


@pytest.mark.parametrize("name", SECONDS)
@pytest.mark.parametrize("value", ["30", None, True])
def test_second_timeouts_must_be_numbers(name: str, value: object) -> None:
    kwargs: dict[str, Any] = {name: value}
    with pytest.raises(ConfigError, match=name):
        DatabaseSettings(URL_, **kwargs)


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("value", [-1, 1.5, 2.0, "3", None, False, 2**31])
def test_bad_keepalive_settings_are_refused(name: str, value: object) -> None:
    kwargs: dict[str, Any] = {name: value}
    with pytest.raises(ConfigError, match=name):
        DatabaseSettings(URL_, **kwargs)


@pytest.mark.parametrize("value", [0, -1, float("nan"), "10", True])
def test_bad_connect_timeout_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="connect_timeout_s"):
        DatabaseSettings(URL_, connect_timeout_s=value)  # type: ignore[arg-type]


def test_zero_turns_timeouts_off() -> None:
    off: dict[str, Any] = dict.fromkeys([*SECONDS, *COUNTS], 0)
    db = DatabaseSettings(URL_, **off)
    args = db.connect_args()
    assert args["options"] == (
        "-c lock_timeout=0 -c statement_timeout=0 -c idle_in_transaction_session_timeout=0 "
        "-c tcp_keepalives_idle=0 -c tcp_keepalives_interval=0 -c tcp_keepalives_count=0 "
        "-c tcp_user_timeout=0"
    )
    assert args["tcp_user_timeout"] == 0 and args["keepalives_idle"] == 0
    assert half_open_s(db) is None  # the kernel's defaults: hours


def test_connect_args_defaults() -> None:
    assert DatabaseSettings(URL_).connect_args() == {
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 2,
        "tcp_user_timeout": 20000,
        "options": "-c lock_timeout=30000 -c statement_timeout=600000 "
        "-c idle_in_transaction_session_timeout=30000 -c tcp_keepalives_idle=10 "
        "-c tcp_keepalives_interval=5 -c tcp_keepalives_count=2 -c tcp_user_timeout=20000",
    }


def test_connect_args_are_whole_milliseconds() -> None:
    db = DatabaseSettings(
        URL_,
        connect_timeout_s=0.2,
        lock_timeout_s=1.5,
        statement_timeout_s=7,
        idle_in_transaction_timeout_s=0.0001,  # never rounds down to 0, which would mean "off"
        tcp_keepalives_idle_s=5,
        tcp_keepalives_interval_s=2,
        tcp_keepalives_count=4,
        tcp_user_timeout_s=2.25,
    )
    args = db.connect_args()
    assert args["connect_timeout"] == 1  # as before: rounded, at least 1 second
    assert args["options"] == (
        "-c lock_timeout=1500 -c statement_timeout=7000 -c idle_in_transaction_session_timeout=1 "
        "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=4 "
        "-c tcp_user_timeout=2250"
    )
    assert (args["keepalives_idle"], args["keepalives_interval"], args["keepalives_count"]) == (5, 2, 4)
    assert args["tcp_user_timeout"] == 2250
    assert all(isinstance(v, int) for k, v in args.items() if k != "options")


def test_connect_args_keep_the_users_options() -> None:
    db = DatabaseSettings("postgresql+psycopg://u@h/x?options=-c%20search_path%3Dpublic", lock_timeout_s=2)
    assert db.connect_args()["options"] == (
        "-c search_path=public -c lock_timeout=2000 -c statement_timeout=600000 "
        "-c idle_in_transaction_session_timeout=30000 -c tcp_keepalives_idle=10 "
        "-c tcp_keepalives_interval=5 -c tcp_keepalives_count=2 -c tcp_user_timeout=20000"
    )
    repeated = DatabaseSettings("postgresql+psycopg://u@h/x?options=-c%20a%3D1&options=-c%20b%3D2")
    assert str(repeated.connect_args()["options"]).startswith("-c a=1 -c b=2 -c lock_timeout=")


def _keepalive_drop(idle: int, interval: int, count: int, user_timeout_ms: int) -> float:
    """When Linux's keepalive timer (net/ipv4/tcp_timer.c) drops a connection whose peer went
    silent at 0 and the server has nothing to send: it fires after `idle` s, probes, then fires
    every `interval` s; it drops at a firing with >= 1 probe out and, with TCP_USER_TIMEOUT, that
    much time since the last packet, else with `count` probes out."""
    elapsed, probes = float(idle), 0
    while True:
        if (user_timeout_ms and elapsed * 1000 >= user_timeout_ms and probes > 0) or (
            not user_timeout_ms and probes >= count
        ):
            return elapsed
        probes += 1
        elapsed += interval


@given(
    st.integers(1, 120),
    st.integers(1, 60),
    st.integers(1, 10),
    st.integers(0, 600_000).map(lambda ms: ms / 1000),
)
def test_the_half_open_bound_is_when_the_kernel_drops_a_silent_client(
    idle: int, interval: int, count: int, user_timeout_s: float
) -> None:
    db = DatabaseSettings(
        URL_,
        tcp_keepalives_idle_s=idle,
        tcp_keepalives_interval_s=interval,
        tcp_keepalives_count=count,
        tcp_user_timeout_s=user_timeout_s,
    )
    ms = int(db.server_settings()["tcp_user_timeout"])
    assert half_open_s(db) == _keepalive_drop(idle, interval, count, ms)


def test_every_server_setting_travels_in_the_startup_options() -> None:
    db = DatabaseSettings(URL_, tcp_keepalives_idle_s=7, tcp_user_timeout_s=1.5)
    settings = db.server_settings()
    assert set(settings) == {
        "lock_timeout",
        "statement_timeout",
        "idle_in_transaction_session_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
    }
    assert (settings["tcp_keepalives_idle"], settings["tcp_user_timeout"]) == ("7", "1500")
    assert str(db.connect_args()["options"]).split() == [
        w for n, v in settings.items() for w in ("-c", f"{n}={v}")
    ]


def test_a_session_lacks_what_its_startup_packet_did_not_set() -> None:
    wanted = DatabaseSettings(URL_).server_settings()
    direct = [(n, v, "client") for n, v in wanted.items()]
    assert lacking(wanted, direct) == []
    # the TCP settings count by their source: pg_settings shows the socket's value (the kernel's
    # default for 0, 0 over a Unix socket), not what was asked
    unix = [(n, "0" if n.startswith("tcp_") else v, "client") for n, v in wanted.items()]
    assert lacking(wanted, unix) == []
    pooler = [(n, "0", "default") for n in wanted]  # PgBouncer dropped the options
    assert lacking(wanted, pooler) == list(wanted)
    other = [(n, "1" if n == "lock_timeout" else v, "client") for n, v in wanted.items()]
    assert lacking(wanted, other) == ["lock_timeout"]


def _cparams(engine: sa.Engine) -> dict[str, Any]:
    """What the engine would hand psycopg.connect (captured instead of connecting)."""
    captured: dict[str, Any] = {}

    class _Stop(Exception):
        pass

    @sa.event.listens_for(engine, "do_connect")
    def _capture(dialect: object, conn_rec: object, cargs: object, cparams: dict[str, Any]) -> None:
        captured.update(cparams)
        raise _Stop

    with pytest.raises(_Stop):
        engine.connect()
    engine.dispose()
    return captured


def test_engine_for_passes_connect_args_over_the_url_query() -> None:
    db = DatabaseSettings(
        "postgresql+psycopg://u@db.invalid/x?options=-c%20search_path%3Dpublic&connect_timeout=99",
        statement_timeout_s=7,
    )
    engine = engine_for(db)
    # pinged only after PING_IF_IDLE_S idle (store.database._ping_when_idle), not at every checkout
    assert not engine.pool._pre_ping
    assert len(engine.pool.dispatch.checkout) == 1 and len(engine.pool.dispatch.checkin) == 1
    assert engine.hide_parameters
    params = _cparams(engine)
    assert {k: params[k] for k in db.connect_args()} == db.connect_args()
    assert "search_path=public" in params["options"] and "statement_timeout=7000" in params["options"]


def test_engine_for_merges_caller_connect_args_over_ours() -> None:
    db = DatabaseSettings(URL_)
    engine = engine_for(
        db, connect_args={"keepalives_idle": 99, "application_name": "me"}, pool_pre_ping=True
    )
    assert engine.pool._pre_ping and not engine.pool.dispatch.checkout
    params = _cparams(engine)
    assert params["keepalives_idle"] == 99 and params["application_name"] == "me"
    assert params["options"] == db.connect_args()["options"] and params["keepalives_count"] == 2
    with pytest.raises(TypeError, match="connect_args"):
        engine_for(db, connect_args=["not", "a", "mapping"])


def test_repr_shows_the_timeouts() -> None:
    shown = repr(DatabaseSettings("postgresql+psycopg://u:pw-r@h/x", lock_timeout_s=1.5))
    assert "lock_timeout_s=1.5" in shown and "tcp_keepalives_count=2" in shown and "pw-r" not in shown


def test_pickle_round_trip_keeps_every_field() -> None:
    db = DatabaseSettings(
        Secret("postgresql+psycopg://u:pw@h:5433/x?sslpassword=ssl-pw&options=-c%20search_path%3Dpublic"),
        schema="s9",
        connect_timeout_s=3.5,
        lock_timeout_s=1.5,
        statement_timeout_s=7,
        idle_in_transaction_timeout_s=9.0,
        tcp_keepalives_idle_s=11,
        tcp_keepalives_interval_s=12,
        tcp_keepalives_count=13,
        tcp_user_timeout_s=14.5,
        lineage_retention_days=7.5,
        lineage=False,
    )
    copy = pickle.loads(pickle.dumps(db))  # noqa: S301 - our own data
    assert copy == db and hash(copy) == hash(db)
    for f in dataclasses.fields(DatabaseSettings):
        assert getattr(copy, f.name) == getattr(db, f.name), f.name
    assert copy.url.password == "pw" and copy.secret_values() == db.secret_values()
    assert copy.connect_args() == db.connect_args()
    # the defaults are not what survived: every field above was set to a non-default value
    default = DatabaseSettings("postgresql+psycopg://u@h/x")
    assert all(getattr(db, f.name) != getattr(default, f.name) for f in dataclasses.fields(DatabaseSettings))


def test_replace_keeps_validation() -> None:
    db = DatabaseSettings(URL_)
    assert dataclasses.replace(db, lock_timeout_s=2).lock_timeout_s == 2
    with pytest.raises(ConfigError, match="lock_timeout_s"):
        dataclasses.replace(db, lock_timeout_s=-2)


# --- SQLSTATE helpers -------------------------------------------------------------------------


def test_timeout_sqlstates() -> None:
    lock = _dbapi(sa.exc.OperationalError, "canceling statement due to lock timeout", "55P03")
    statement = _dbapi(sa.exc.OperationalError, "canceling statement due to statement timeout", "57014")
    assert is_lock_timeout(lock) and not is_statement_timeout(lock)
    assert is_statement_timeout(statement) and not is_lock_timeout(statement)
    for exc in (lock, statement):
        assert not is_retryable(exc) and not is_connection_lost(exc)
    assert not is_lock_timeout(_dbapi(sa.exc.OperationalError, "gone", None))
    assert not is_lock_timeout(RuntimeError("55P03")) and not is_statement_timeout(ValueError("57014"))
