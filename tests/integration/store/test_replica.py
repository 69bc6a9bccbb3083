"""A streaming replica and a failover, with the library's own engine and the CLI: a libpq multi-host
URL (``target_session_attrs=read-write``) goes through DatabaseSettings and engine_for to whichever
server takes writes, before and after the replica is promoted; a read-only old primary (planned
switchover) is transient and its pooled connection is not reused after the promotion.

A throwaway primary+replica pair per test (:class:`txn_offsets.devstack.replica.Pair`, free ports,
its own directory): the stack's PostgreSQL is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.devstack import Stack, postgres, replica
from txn_offsets.errors import CommitNotApplied, OffsetsRolledBack, Transient
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[replica.Pair]:
    p = replica.Pair.create(tmp_path / "pair", f"a-{uuid.uuid4().hex}", f"p-{uuid.uuid4().hex}")
    try:
        p.start()
        yield p
    finally:
        p.destroy()


def _port(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT inet_server_port()")).scalar_one())


def test_multi_host_url_follows_a_promotion(pair: replica.Pair) -> None:
    db = DatabaseSettings(Secret(pair.url()), schema="s_failover")
    assert "127.0.0.1%3A" in db.display_url or "127.0.0.1:" in db.display_url
    assert pair.app_password not in db.display_url + repr(db)
    migrate.upgrade(db)
    engine = engine_for(db, pool_size=1, max_overflow=0)
    store = Store(engine, db)
    try:
        assert _port(engine) == pair.primary.port
        run = start_run(Store(engine, db), "j")
        seed(engine, db, "j", {("t", 0): 0})
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])[0].outcome is Outcome.COMMITTED
        replica.wait_replayed(pair.primary, pair.replica, pair.admin_password)
        standby = sa.create_engine(pair.url(node=pair.replica))
        with standby.connect() as conn:  # a hot standby: readable, in recovery, has the commit
            assert conn.execute(sa.text("SELECT pg_is_in_recovery()")).scalar_one() is True
            assert conn.execute(sa.text('SELECT off FROM "s_failover".offsets')).scalar_one() == 5
        standby.dispose()

        replica.kill_9(pair.primary)
        with pytest.raises(Transient):  # the pooled connection is dead, no server takes writes
            commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)])
        replica.promote(pair.replica, pair.admin_password)
        # the same engine reconnects, to the promoted replica
        assert commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)])[0].outcome is Outcome.COMMITTED
        assert _port(engine) == pair.replica.port
        assert offsets_of(engine, db, "j") == {("t", 0): 9}
        # the CLI takes the same multi-host URL from the environment
        env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": pair.url(), "TXN_OFFSETS_SCHEMA": "s_failover"}
        done = subprocess.run(
            [sys.executable, "-m", "txn_offsets.cli", "offsets", "show", "--job", "j", "--format", "json"],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert re.search(r'"offset":\s*9\b', done.stdout), done.stdout
        assert pair.app_password not in done.stdout + done.stderr
    finally:
        engine.dispose()


def test_planned_switchover_read_only_then_new_primary(pair: replica.Pair) -> None:
    db = DatabaseSettings(Secret(pair.url()), schema="s_switch")
    migrate.upgrade(db)
    engine = engine_for(db, pool_size=1, max_overflow=0)
    store = Store(engine, db)
    try:
        run = start_run(Store(engine, db), "j")
        seed(engine, db, "j", {("t", 0): 0})
        assert _port(engine) == pair.primary.port  # the pool holds a connection to the old primary
        info = postgres.admin_conninfo(pair.primary, pair.admin_password)
        with psycopg.connect(**info, autocommit=True) as c:  # type: ignore[arg-type]
            c.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            c.execute("SELECT pg_reload_conf()")
        # a backend applies a reload when the signal reaches it: wait until the pooled one has it
        # (pool_size=1: the same backend commit_ranges uses), or the write can still get through
        deadline = time.monotonic() + 15
        while True:
            with engine.connect() as conn:
                if conn.execute(sa.text("SHOW default_transaction_read_only")).scalar_one() == "on":
                    break
            assert time.monotonic() < deadline, "the old primary never turned read-only"
            time.sleep(0.05)
        with pytest.raises(Transient):  # 25006 on the old primary, then no server takes writes
            commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])
        replica.wait_replayed(pair.primary, pair.replica, pair.admin_password)
        replica.stop(pair.primary)
        replica.promote(pair.replica, pair.admin_password)
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])[0].outcome is Outcome.COMMITTED
        assert _port(engine) == pair.replica.port
        assert offsets_of(engine, db, "j") == {("t", 0): 5}
    finally:
        engine.dispose()


def test_stack_up_with_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TXN_OFFSETS_PG_PORT", "TXN_OFFSETS_KAFKA_PORT", "TXN_OFFSETS_KAFKA_CONTROLLER_PORT"):
        monkeypatch.delenv(var, raising=False)
    stack = Stack(tmp_path / "stack")
    try:
        st = stack.up(replica=True)
        assert st.postgres_pid and st.replica_pid and st.replica_port
        env = stack.env()
        ha = sa.create_engine(env["TXN_OFFSETS_HA_DATABASE_URL"])
        standby = sa.create_engine(env["TXN_OFFSETS_REPLICA_DATABASE_URL"])
        with ha.connect() as a, standby.connect() as b:
            assert a.execute(sa.text("SELECT inet_server_port(), pg_is_in_recovery()")).one() == (
                st.postgres_port,
                False,
            )
            assert b.execute(sa.text("SELECT inet_server_port(), pg_is_in_recovery()")).one() == (
                st.replica_port,
                True,
            )
        ha.dispose()
        standby.dispose()
        assert "target_session_attrs=read-write" in env["TXN_OFFSETS_HA_DATABASE_URL"]
        assert sorted(stack.down()) == ["kafka", "postgres", "replica"]
    finally:
        stack.down()
        for where in (stack.dir, stack.dir / "replica"):
            base = postgres.cluster_for(where, 1).data_dir.parent
            if not str(base).startswith(str(tmp_path)):
                shutil.rmtree(base.parent, ignore_errors=True)


def test_commits_lost_in_a_failover_are_planned_again_not_a_conflict(pair: replica.Pair) -> None:
    """Asynchronous replication: what the old primary committed after the replica's last WAL is gone
    from the new primary, results and offsets together. A range planned from the old primary's
    offsets then finds the stored offset BEHIND its start: OffsetsRolledBack (transient: plan again
    from the table), not an OffsetConflict that ends the run."""
    db = DatabaseSettings(Secret(pair.url()), schema="s_lost")
    migrate.upgrade(db)
    engine = engine_for(db, pool_size=1, max_overflow=0)
    store = Store(engine, db)
    try:
        run = start_run(Store(engine, db), "j")
        seed(engine, db, "j", {("t", 0): 0})
        replica.wait_replayed(pair.primary, pair.replica, pair.admin_password)
        info = postgres.admin_conninfo(pair.primary, pair.admin_password)
        with psycopg.connect(**info, autocommit=True) as c:  # type: ignore[arg-type]
            senders = [int(pid) for (pid,) in c.execute("SELECT pid FROM pg_stat_replication").fetchall()]
        assert senders
        for pid in senders:  # the replica lags: nothing more reaches it
            os.kill(pid, signal.SIGSTOP)
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])[0].outcome is Outcome.COMMITTED
        replica.kill_9(pair.primary)
        replica.promote(pair.replica, pair.admin_password)
        check = sa.create_engine(pair.url(), pool_pre_ping=True)
        assert offsets_of(check, db, "j") == {("t", 0): 0}  # the commit is gone with the old primary
        with pytest.raises(OffsetsRolledBack) as info_:
            commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)])  # planned from the old offsets
        assert isinstance(info_.value, Transient)
        assert (info_.value.expected, info_.value.found) == (5, 0)
        # planning again from the table re-reads the lost range
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 9)])[0].outcome is Outcome.COMMITTED
        assert offsets_of(check, db, "j") == {("t", 0): 9}
        check.dispose()
    finally:
        engine.dispose()


def _commit_in_flight(info: dict[str, object], timeout_s: float) -> None:
    """Until a backend of the server `info` reaches is inside a COMMIT (bounded)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(**info, autocommit=True) as c:  # type: ignore[arg-type]
        while not c.execute(
            "SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query = 'COMMIT'"
        ).fetchall():
            assert time.monotonic() < deadline, f"no COMMIT in flight after {timeout_s:.0f} s"
            time.sleep(0.01)


def _release(frozen: list[int]) -> None:
    """Kill what `replica.freeze` stopped, whatever happened in between: a stopped server's kernel still
    acknowledges TCP, so a client waiting on it would wait forever (the CI hang of c50a54e)."""
    for pid in frozen:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def test_commit_in_flight_during_failover_is_resolved_on_the_new_primary(pair: replica.Pair) -> None:
    """The primary dies inside a COMMIT (frozen there, the replica promoted, then killed): the
    client's connection drops during COMMIT and the guard's re-read, a fresh connection through the
    multi-host URL, reads the NEW primary: the commit did not happen there, CommitNotApplied.

    Deterministic and bounded: the COMMIT is held in flight by a 30 s deferred trigger until the
    test has frozen the server (no race with a short sleep); the commit runs in a thread joined with
    a timeout; the frozen server is killed in ``finally`` whatever failed before."""
    db = DatabaseSettings(Secret(pair.url()), schema="s_inflight")
    migrate.upgrade(db)
    engine = engine_for(db, pool_size=1, max_overflow=0)
    store = Store(engine, db)
    frozen: list[int] = []
    try:
        run = start_run(Store(engine, db), "j")
        seed(engine, db, "j", {("t", 0): 0})
        with engine.begin() as conn:  # every COMMIT of a write waits 30 s in a deferred trigger
            conn.execute(sa.text('CREATE TABLE "s_inflight".w (id int)'))
            conn.execute(sa.text(SLOW_COMMIT))
        replica.wait_replayed(pair.primary, pair.replica, pair.admin_password, timeout_s=30)
        outcome: list[object] = []

        def insert_w(conn: sa.Connection) -> None:
            conn.execute(sa.text('INSERT INTO "s_inflight".w VALUES (1)'))

        def commit() -> None:
            try:
                ranges = [OffsetRange("t", 0, 0, 5)]
                outcome.append(commit_ranges(store, run, ranges, insert_w))
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)

        worker = threading.Thread(target=commit, name="commit-in-flight", daemon=True)
        worker.start()
        _commit_in_flight(postgres.admin_conninfo(pair.primary, pair.admin_password, postgres.APP_DB), 20)
        replica.freeze(pair.primary, frozen)
        replica.promote(pair.replica, pair.admin_password, timeout_s=30)
        replica.kill_9(pair.primary)
        worker.join(60)
        assert not worker.is_alive(), "commit_ranges still waiting 60 s after the old primary died"
        (failure,) = outcome
        assert isinstance(failure, CommitNotApplied), failure
        assert "connection lost during COMMIT" in str(failure)
        assert _port(engine) == pair.replica.port  # the re-read (and everything since) is the new primary
        assert offsets_of(engine, db, "j") == {("t", 0): 0}
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])[0].outcome is Outcome.COMMITTED
        assert offsets_of(engine, db, "j") == {("t", 0): 5}
    finally:
        _release(frozen)
        engine.dispose()


SLOW_COMMIT = """
CREATE FUNCTION "s_inflight".slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON "s_inflight".w
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "s_inflight".slow();
"""


@pytest.mark.slow  # its own primary+replica pair (~20-35 s to start on this loaded 2-core box)
def test_synchronous_replication_loses_no_acknowledged_commit_in_a_failover(pair: replica.Pair) -> None:
    """F15 with synchronous replication: the replica is the sync standby, so a COMMIT is answered
    only once the replica has it. The acknowledged commit survives the primary's kill -9 (async,
    test_commits_lost_in_a_failover_are_planned_again_not_a_conflict, loses it); the one in flight
    when the WAL sender stalls is never acknowledged, and the guard's re-read on the new primary
    says CommitNotApplied: nothing acknowledged lost, nothing applied twice."""
    db = DatabaseSettings(Secret(pair.url()), schema="s_sync")
    migrate.upgrade(db)
    replica.make_synchronous(pair.primary, pair.admin_password, timeout_s=30)
    engine = engine_for(db, pool_size=1, max_overflow=0)
    store = Store(engine, db)
    frozen: list[int] = []
    try:
        run = start_run(Store(engine, db), "j")
        seed(engine, db, "j", {("t", 0): 0})
        assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])[0].outcome is Outcome.COMMITTED
        info = postgres.admin_conninfo(pair.primary, pair.admin_password)
        with psycopg.connect(**info, autocommit=True) as c:  # type: ignore[arg-type]
            senders = [int(pid) for (pid,) in c.execute("SELECT pid FROM pg_stat_replication").fetchall()]
        assert senders
        for pid in senders:  # the replica gets nothing more, as in F15
            frozen.append(pid)
            os.kill(pid, signal.SIGSTOP)
        outcome: list[object] = []

        def commit() -> None:
            try:
                outcome.append(commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)]))
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)

        worker = threading.Thread(target=commit, name="commit-waits-for-sync", daemon=True)
        worker.start()
        deadline = time.monotonic() + 20  # the COMMIT waits for the standby: never acknowledged
        with psycopg.connect(**info, autocommit=True) as c:  # type: ignore[arg-type]
            while not c.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchall():
                assert time.monotonic() < deadline, "no COMMIT waiting for the synchronous standby"
                time.sleep(0.02)
        assert worker.is_alive() and outcome == []
        replica.freeze(pair.primary, frozen)  # as F17: the client notices once the new primary is up
        replica.promote(pair.replica, pair.admin_password, timeout_s=30)
        replica.kill_9(pair.primary)
        worker.join(60)
        assert not worker.is_alive(), "commit_ranges still waiting 60 s after the old primary died"
        (failure,) = outcome
        assert isinstance(failure, CommitNotApplied), failure
        check = sa.create_engine(pair.url(), pool_pre_ping=True)
        try:
            assert offsets_of(check, db, "j") == {("t", 0): 5}  # the acknowledged commit survived
            assert commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)])[0].outcome is Outcome.COMMITTED
            assert offsets_of(check, db, "j") == {("t", 0): 9}
        finally:
            check.dispose()
    finally:
        _release(frozen)
        engine.dispose()
