"""Pooled connections in the hot path: a transaction makes no round trip it does not need,
and a pooled connection that died meanwhile costs a retry, never a failed range or a lost one.

engine_for pings a pooled connection only when it sat idle for longer than PING_IF_IDLE_S (a ping
before every transaction was one round trip in five). A connection in steady use that broke is
found out by the claim, before anything could be committed: commit_ranges then tries again on a
fresh connection.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import database
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run


@pytest.fixture
def hot_engine(migrated: DatabaseSettings) -> Iterator[sa.Engine]:
    """An engine as the workers make it: one pooled connection, reused."""
    eng = engine_for(migrated, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def _backend_pid(eng: sa.Engine) -> int:
    with eng.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(admin_engine: sa.Engine, pid: int) -> None:
    with admin_engine.begin() as admin:
        assert admin.execute(sa.text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid}).scalar_one()


def _round_trips(eng: sa.Engine, act: object) -> tuple[int, list[str]]:
    """Run `act()` with libpq's protocol trace on the pooled connection; the server's answers
    that end a round trip (ReadyForQuery) and the statements sent."""
    with eng.connect() as conn:
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
    with tempfile.TemporaryFile("w+") as trace:
        raw.pgconn.trace(trace.fileno())
        raw.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            act()  # type: ignore[operator]
        finally:
            raw.pgconn.untrace()
        trace.flush()
        os.fsync(trace.fileno())
        trace.seek(0)
        lines = trace.read().splitlines()
    answers = sum(1 for line in lines if "ReadyForQuery" in line)
    sent = [line.split("\t")[3][:40] for line in lines if line.startswith("F\t") and "\tQuery\t" in line]
    sent += [line.split("\t")[3][:40] for line in lines if line.startswith("F\t") and "\tParse\t" in line]
    return answers, sent


def test_a_transaction_makes_four_round_trips_however_many_ranges(
    hot_engine: sa.Engine, migrated: DatabaseSettings, run: Run, aggregate: Aggregate
) -> None:
    seed(hot_engine, migrated, run.job, {("t", 0): 0, ("t", 1): 0, ("t", 2): 0})
    commit_ranges(Store(hot_engine, migrated), run, [OffsetRange("t", 0, 0, 5)], aggregate.write)  # warm
    three = [OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 0, 3), OffsetRange("t", 2, 0, 7)]
    answers, sent = _round_trips(
        hot_engine, lambda: commit_ranges(Store(hot_engine, migrated), run, three, aggregate.write)
    )
    # BEGIN, ONE statement claiming the three ranges and inserting their lineage rows, the write,
    # COMMIT: no ping of a connection in steady use (was 7 before the claims were one statement:
    # BEGIN, a claim per range, the lineage INSERT, the write, COMMIT)
    assert answers == 4, sent
    assert sum(s.lstrip(' "').startswith("WITH want") for s in sent) == 1, sent
    assert offsets_of(hot_engine, migrated, run.job) == {("t", 0): 9, ("t", 1): 3, ("t", 2): 7}
    assert aggregate.value() == 2
    with hot_engine.connect() as conn:
        rows = conn.execute(
            sa.text(f'SELECT topic, part, from_off, until_off FROM "{migrated.schema}".commits ORDER BY id')
        ).all()
    assert [tuple(r) for r in rows] == [("t", 0, 0, 5), ("t", 0, 5, 9), ("t", 1, 0, 3), ("t", 2, 0, 7)]


def test_a_pooled_connection_killed_between_ranges_costs_a_retry_not_the_range(
    hot_engine: sa.Engine,
    admin_engine: sa.Engine,
    migrated: DatabaseSettings,
    run: Run,
    aggregate: Aggregate,
) -> None:
    seed(hot_engine, migrated, run.job, {("t", 0): 0})
    hot = Store(hot_engine, migrated)
    rng = [OffsetRange("t", 0, 0, 10)]
    assert commit_ranges(hot, run, rng, aggregate.write)[0].outcome is Outcome.COMMITTED
    before = _backend_pid(hot_engine)
    _terminate(admin_engine, before)  # the pooled connection is dead; the pool does not know yet
    nxt = [OffsetRange("t", 0, 10, 20)]
    assert commit_ranges(hot, run, nxt, aggregate.write)[0].outcome is Outcome.COMMITTED
    assert _backend_pid(hot_engine) != before
    assert aggregate.value() == 2 and aggregate.calls == 2  # the failed attempt never reached the write
    assert offsets_of(hot_engine, migrated, run.job) == {("t", 0): 20}


def test_an_idle_pooled_connection_is_pinged_and_replaced(
    hot_engine: sa.Engine,
    admin_engine: sa.Engine,
    migrated: DatabaseSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _backend_pid(hot_engine)
    _terminate(admin_engine, before)
    monkeypatch.setattr(database, "PING_IF_IDLE_S", 0.0)  # every checked-in connection counts as idle
    # the ping finds it dead: the pool hands out a new connection and the statement just works
    with hot_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 41 + 1")).scalar_one() == 42
    assert _backend_pid(hot_engine) != before
