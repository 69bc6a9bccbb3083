"""DatabaseSettings' timeouts reach a real PostgreSQL through engine_for, next to the user's options."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for, is_lock_timeout, is_statement_timeout
from txn_offsets.store.pooler import POOLED

TIMEOUTS: dict[str, Any] = {
    "lock_timeout_s": 1.5,
    "statement_timeout_s": 7,
    "idle_in_transaction_timeout_s": 9,
}


def _show(engine: sa.Engine, *names: str) -> dict[str, str]:
    with engine.connect() as conn:
        return {name: conn.execute(sa.text(f"SHOW {name}")).scalar_one() for name in names}


@pytest.fixture
def settings_engine(database_url: str) -> Iterator[sa.Engine]:
    engine = engine_for(DatabaseSettings(Secret(database_url), **TIMEOUTS))
    yield engine
    engine.dispose()


def test_session_timeouts_are_set_at_connect(settings_engine: sa.Engine) -> None:
    assert _show(
        settings_engine, "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"
    ) == {"lock_timeout": "1500ms", "statement_timeout": "7s", "idle_in_transaction_session_timeout": "9s"}
    with settings_engine.connect() as conn:
        params = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    assert (params["keepalives"], params["keepalives_idle"], params["keepalives_count"]) == ("1", "10", "2")
    assert params["tcp_user_timeout"] == "20000"


def test_the_server_end_of_the_tcp_bounds_is_set_at_connect(database_url: str) -> None:
    """What a real session gets (pg_settings): the server's own keepalives and user timeout on the
    client's socket, from the same fields as libpq's, set by the startup packet."""
    db = DatabaseSettings(
        Secret(database_url), tcp_keepalives_idle_s=7, tcp_keepalives_interval_s=3, tcp_keepalives_count=4
    )
    engine = engine_for(db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT name, setting, source FROM pg_settings WHERE name = ANY(:names)"),
                {"names": list(db.server_settings())},
            ).all()
            pooled = bool(conn.connection.info.get(POOLED))
    finally:
        engine.dispose()
    assert {name: (setting, source) for name, setting, source in rows} == {
        "lock_timeout": ("30000", "client"),
        "statement_timeout": ("600000", "client"),
        "idle_in_transaction_session_timeout": ("30000", "client"),
        "tcp_keepalives_idle": ("7", "client"),
        "tcp_keepalives_interval": ("3", "client"),
        "tcp_keepalives_count": ("4", "client"),
        "tcp_user_timeout": ("20000", "client"),
    }
    assert not pooled  # all of them came with the startup packet: nothing is set per transaction


def test_the_users_options_in_the_url_are_kept(database_url: str) -> None:
    url = make_url(database_url).update_query_dict(
        {"options": "-c search_path=public -c application_name=txn_offsets_settings_test"}
    )
    engine = engine_for(DatabaseSettings(url, **TIMEOUTS))
    try:
        shown = _show(engine, "search_path", "application_name", "lock_timeout", "statement_timeout")
    finally:
        engine.dispose()
    assert shown == {
        "search_path": "public",
        "application_name": "txn_offsets_settings_test",
        "lock_timeout": "1500ms",
        "statement_timeout": "7s",
    }


def test_zero_turns_the_server_timeouts_off(database_url: str) -> None:
    off: dict[str, Any] = dict.fromkeys(TIMEOUTS, 0)
    engine = engine_for(DatabaseSettings(database_url, **off))
    try:
        shown = _show(engine, "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
    finally:
        engine.dispose()
    assert set(shown.values()) == {"0"}


def test_lock_and_statement_timeouts_are_recognised(database_url: str) -> None:
    engine = engine_for(DatabaseSettings(database_url, lock_timeout_s=0.2, statement_timeout_s=0.3))
    key = uuid.uuid4().int % 2**62
    try:
        with engine.connect() as holder, engine.connect() as waiter:
            holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                with pytest.raises(sa.exc.DBAPIError) as lock_info:
                    waiter.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
                waiter.rollback()
                with pytest.raises(sa.exc.DBAPIError) as statement_info:
                    waiter.execute(sa.text("SELECT pg_sleep(5)"))
                waiter.rollback()
            finally:
                holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                holder.commit()
    finally:
        engine.dispose()
    assert is_lock_timeout(lock_info.value) and not is_statement_timeout(lock_info.value)
    assert is_statement_timeout(statement_info.value) and not is_lock_timeout(statement_info.value)


def test_behind_pgbouncer_every_transaction_sets_the_server_settings(pooled_database_url: str) -> None:
    """PgBouncer drops the startup options: each transaction sets them (SET LOCAL), the TCP bounds
    of the pooler's server connection too, and they do not outlive it."""
    db = DatabaseSettings(Secret(pooled_database_url), tcp_keepalives_idle_s=7)
    engine = engine_for(db)
    names = ["lock_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle", "tcp_user_timeout"]
    query = sa.text("SELECT name, setting FROM pg_settings WHERE name = ANY(:names) ORDER BY name")
    try:
        with engine.connect() as conn:
            assert conn.connection.info.get(POOLED)
            inside: dict[str, str] = dict(conn.execute(query, {"names": names}).all())
            conn.rollback()
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")  # no transaction: nothing set
            outside: dict[str, str] = dict(auto.execute(query, {"names": names}).all())
    finally:
        engine.dispose()
    assert inside == {
        "idle_in_transaction_session_timeout": "30000",
        "lock_timeout": "30000",
        "tcp_keepalives_idle": "7",
        "tcp_user_timeout": "20000",
    }
    assert outside["tcp_keepalives_idle"] != "7" and outside["lock_timeout"] != "30000"
