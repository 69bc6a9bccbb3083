"""What a failover looks like to a client, classified: every one of these is transient (retried by
``run_job`` from the stored offsets), never a crash, and a read-only server's connection is thrown
away, so the retry reaches the new primary instead of the old one again.

* 25006 read_only_sql_transaction: a planned switchover turns the old primary read-only
  (``default_transaction_read_only``); here the session gets it through libpq's ``options``;
* 57P01 admin_shutdown: the old primary shuts down (``pg_terminate_backend`` gives the same code);
* 08006 connection_failure: the socket is gone.
"""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ServiceUnavailable, Transient
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for, is_connection_lost, translate_errors
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

READ_ONLY = "-c default_transaction_read_only=on"


def _read_only(db: DatabaseSettings) -> DatabaseSettings:
    """`db` whose every transaction is read-only, as on a primary in a planned switchover."""
    url = db.url.update_query_dict({"options": READ_ONLY})
    return DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=db.schema)


def test_read_only_server_is_transient_and_its_connection_is_dropped(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    ro = _read_only(migrated)
    ro_engine = engine_for(ro, pool_size=1, max_overflow=0)
    try:
        with ro_engine.connect() as conn:
            first_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with pytest.raises(Transient) as info:
            commit_ranges(
                Store(ro_engine, ro), run, [OffsetRange("t", 0, 0, 10)], aggregate.write, max_attempts=2
            )
        # the write never ran, nothing moved
        assert aggregate.calls == 0
        assert aggregate.value() == 0
        assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}
        # the read-only server's connection was discarded: the next one is a new session
        with ro_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != first_pid
        with pytest.raises(ServiceUnavailable) as direct, translate_errors(ro), ro_engine.begin() as conn:
            conn.execute(sa.text(f'UPDATE "{ro.schema}".agg SET n = n + 1'))
        assert "read-only" in str(direct.value)
        assert "target_session_attrs=read-write" in str(direct.value)
        assert ro.url.password not in str(direct.value) + str(info.value)
    finally:
        ro_engine.dispose()


def test_admin_shutdown_57p01_is_connection_lost(migrated: DatabaseSettings, admin_engine: sa.Engine) -> None:
    eng = engine_for(migrated, pool_size=1, max_overflow=0)
    try:
        with eng.connect() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with admin_engine.begin() as admin:
                assert admin.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
            with pytest.raises(sa.exc.DBAPIError) as lost:
                conn.execute(sa.text("SELECT 1"))
        assert getattr(lost.value.orig, "sqlstate", None) == "57P01"
        assert is_connection_lost(lost.value)
        with pytest.raises(ServiceUnavailable), translate_errors(migrated):
            raise lost.value
    finally:
        eng.dispose()


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.ConnectionFailure("server closed the connection"),  # 08006
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),  # 57P01
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),  # 25006
        psycopg.errors.CannotConnectNow("the database system is shutting down"),  # 57P03
    ],
    ids=lambda e: type(e).__name__,
)
def test_failover_sqlstates_are_transient(error: psycopg.Error, migrated: DatabaseSettings) -> None:
    wrapped = sa.exc.OperationalError("COMMIT", None, error)
    assert is_connection_lost(wrapped)
    with pytest.raises(ServiceUnavailable), translate_errors(migrated):
        raise wrapped
