"""A connection lost while COMMIT is in progress: the outcome is re-read, never guessed.

To make COMMIT take time, the result table has a deferred constraint trigger that sleeps (only
when the writer sets ``txn_test.commit_sleep_s``). While the server sits in that COMMIT, a helper
either terminates the backend (the transaction is aborted: nothing may be reported as committed)
or cuts the client's socket (the server goes on and commits: it must be reported as committed,
which needs the re-read to wait for the still-running COMMIT instead of reading too early).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.integration.conftest import Ctx
from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets import CommitNotApplied
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

SLEEPY_COMMIT = """
CREATE FUNCTION "{s}".sleepy_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(coalesce(nullif(current_setting('txn_test.commit_sleep_s', true), ''), '0')::float);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER sleepy_commit AFTER UPDATE ON "{s}".agg
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{s}".sleepy_commit();
"""


@pytest.fixture
def sleepy(engine: sa.Engine, aggregate: Aggregate, migrated: DatabaseSettings) -> Aggregate:
    with engine.begin() as conn:
        conn.execute(sa.text(SLEEPY_COMMIT.format(s=migrated.schema)))
    return aggregate


def _when_committing(admin_engine: sa.Engine, pid: int, act: Callable[[], None]) -> threading.Thread:
    """Run `act` once backend `pid` is executing its COMMIT."""

    def watch() -> None:
        deadline = time.monotonic() + 20
        with admin_engine.connect() as conn:
            while time.monotonic() < deadline:
                query = conn.execute(
                    sa.text("SELECT query FROM pg_stat_activity WHERE pid = :pid AND state = 'active'"),
                    {"pid": pid},
                ).scalar_one_or_none()
                conn.rollback()
                if query is not None and query.strip().upper() == "COMMIT":
                    act()
                    return
                time.sleep(0.02)
        raise AssertionError(f"backend {pid} never reached COMMIT")

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_backend_terminated_during_commit_is_not_applied_then_retry_commits(
    engine: sa.Engine,
    admin_engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    run: Run,
    sleepy: Aggregate,
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    rng = [OffsetRange("t", 0, 0, 10)]
    killed: list[bool] = []
    helpers: list[threading.Thread] = []

    def write(conn: sa.Connection) -> None:
        sleepy.write(conn)
        conn.execute(sa.text("SET LOCAL txn_test.commit_sleep_s = '10'"))
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

        def kill() -> None:
            with admin_engine.begin() as admin:
                killed.append(
                    admin.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
                )

        helpers.append(_when_committing(admin_engine, pid, kill))

    started = time.monotonic()
    with pytest.raises(CommitNotApplied) as info:
        commit_ranges(store, run, rng, write)
    helpers[0].join(timeout=30)
    assert killed == [True]
    assert time.monotonic() - started < 8  # it did not wait for the 10 s commit: it was killed
    assert "connection lost during COMMIT" in str(info.value)
    # the re-read found nothing committed: no result, offsets unchanged
    assert sleepy.value() == 0
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}
    # the retry the error asks for commits normally
    assert commit_ranges(store, run, rng, sleepy.write)[0].outcome is Outcome.COMMITTED
    assert sleepy.value() == 1
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 10}


def test_acknowledgement_lost_after_server_committed_is_committed(
    ctx: Ctx, admin_engine: sa.Engine, sleepy: Aggregate, caplog: pytest.LogCaptureFixture
) -> None:
    engine, migrated, run = ctx.engine, ctx.db, ctx.run
    caplog.set_level(logging.INFO, logger="txn_offsets.commit.shell")
    seed(engine, migrated, run.job, {("t", 0): 0})
    rng = [OffsetRange("t", 0, 0, 10)]
    helpers: list[threading.Thread] = []

    def write(conn: sa.Connection) -> None:
        sleepy.write(conn)
        conn.execute(sa.text("SET LOCAL txn_test.commit_sleep_s = '1.5'"))
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        fd = conn.connection.dbapi_connection.pgconn.socket  # type: ignore[union-attr]

        def cut_client_socket() -> None:
            # the network drops: the client sees EOF, the server keeps committing
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

        helpers.append(_when_committing(admin_engine, pid, cut_client_socket))

    started = time.monotonic()
    outcomes = commit_ranges(Store(engine, migrated), run, rng, write)
    helpers[0].join(timeout=30)
    # the re-read waited for the server's COMMIT (still sleeping when the client lost it)
    assert time.monotonic() - started >= 1.4
    assert outcomes[0].outcome is Outcome.COMMITTED
    assert any("connection lost during COMMIT" in r.getMessage() for r in caplog.records)
    assert sleepy.value() == 1
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 10}
    # and a retry of the same range is a no-op
    assert (
        commit_ranges(Store(engine, migrated), run, rng, sleepy.write)[0].outcome is Outcome.ALREADY_COMMITTED
    )
    assert sleepy.value() == 1
