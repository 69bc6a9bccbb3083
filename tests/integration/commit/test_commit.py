"""The guarded commit protocol on real PostgreSQL: commit, retry, conflict, fencing, no partial writes."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from tests.integration.conftest import Ctx
from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets import (
    CommitNotApplied,
    ConfigError,
    Fenced,
    OffsetConflict,
    OffsetsMovedOn,
    SchemaMissing,
    UnknownJob,
    WriteFailed,
)
from txn_offsets.commit import Outcome
from txn_offsets.commit.claim import claim_ranges
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Transient
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


def test_commit_moves_the_offset_and_writes_once(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("a", 0): 10, ("a", 1): 0, ("b", 0): 5})
    ranges = [OffsetRange("b", 0, 5, 9), OffsetRange("a", 0, 10, 20), OffsetRange("a", 1, 0, 3)]
    outcomes = commit_ranges(store, run, ranges, aggregate.write)
    # outcomes come back in the caller's order, whatever order the claims ran in
    assert [o.range for o in outcomes] == ranges
    assert {o.outcome for o in outcomes} == {Outcome.COMMITTED}
    assert offsets_of(engine, migrated, run.job) == {("a", 0): 20, ("a", 1): 3, ("b", 0): 9}
    assert aggregate.value() == 1


def test_retry_after_commit_is_a_noop(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    rng = OffsetRange("t", 0, 0, 100)
    first = commit_ranges(store, run, [rng], aggregate.write)
    again = commit_ranges(store, run, [rng], aggregate.write)
    assert first[0].outcome is Outcome.COMMITTED
    assert again[0].outcome is Outcome.ALREADY_COMMITTED
    assert aggregate.calls == 1  # the retry never called write
    assert aggregate.value() == 1
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 100}


def test_conflict_raises_with_context_and_writes_nothing(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    # past the start at the run's own generation: a conflict the runner plans past (OffsetsMovedOn)
    seed(engine, migrated, run.job, {("t", 0): 50})
    with pytest.raises(OffsetConflict) as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 40, 60)], aggregate.write)
    err = info.value
    assert isinstance(err, OffsetsMovedOn) and isinstance(err, Transient)
    assert (err.job, err.topic, err.partition, err.expected, err.found) == (run.job, "t", 0, 40, 50)
    assert "is 50, past the planned start 40" in str(err)
    assert aggregate.calls == 0
    assert aggregate.value() == 0
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 50}


# Before: the claim found the offset past its start and raised OffsetConflict, which the runner does
# not retry: a task of a cancelled batch that reached its COMMIT after the batch was planned again
# stopped the run ("restart the job"), although only the run's own tasks write under its generation.
def test_a_straggler_commit_of_this_run_is_planned_past_not_a_conflict(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    straggler = engine.connect()  # a task of a failed batch, inside its transaction: claimed [0, 5)
    held = straggler.begin()
    claim_ranges(straggler, migrated, run, [OffsetRange("t", 0, 0, 5)])
    found: list[BaseException] = []

    def replanned() -> None:  # the batch planned again from the table (still at 0): [0, 8)
        try:
            commit_ranges(store, run, [OffsetRange("t", 0, 0, 8)], aggregate.write)
        except BaseException as exc:
            found.append(exc)

    thread = threading.Thread(target=replanned)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not _waiting_on_a_lock(engine):  # the new claim waits for the straggler's row
            assert thread.is_alive() and time.monotonic() < deadline, found
            time.sleep(0.05)
        held.commit()
    finally:
        straggler.close()
        thread.join(30)
    assert len(found) == 1 and isinstance(found[0], OffsetsMovedOn), found
    assert isinstance(found[0], Transient)  # run_job plans again, from 5
    assert (found[0].expected, found[0].found) == (0, 5)
    assert aggregate.calls == 0  # nothing written by the replanned batch
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5}


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        waiting = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return bool(waiting)


def test_missing_row_is_a_conflict(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    with pytest.raises(OffsetConflict) as info:
        commit_ranges(store, run, [OffsetRange("t", 3, 0, 1)])
    assert info.value.found is None
    assert "no offset row" in str(info.value)
    assert offsets_of(engine, migrated, run.job) == {}


def test_half_committed_batch_is_a_conflict_and_claims_nothing(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0, ("t", 1): 0})
    commit_ranges(store, run, [OffsetRange("t", 0, 0, 10)], aggregate.write)
    # a different batch shape covering the committed range and a fresh one
    with pytest.raises(OffsetConflict) as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10)], aggregate.write)
    assert (info.value.partition, info.value.expected, info.value.found) == (0, 0, 10)
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 10, ("t", 1): 0}
    assert aggregate.value() == 1


def test_fenced_run_cannot_commit(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    newer = start_run(store, run.job, force=True)
    assert newer.generation == run.generation + 1
    with pytest.raises(Fenced) as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], aggregate.write)
    assert (info.value.generation, info.value.current) == (run.generation, newer.generation)
    assert aggregate.value() == 0
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}
    # the new run commits the same range normally
    out = commit_ranges(store, newer, [OffsetRange("t", 0, 0, 5)], aggregate.write)
    assert out[0].outcome is Outcome.COMMITTED
    assert aggregate.value() == 1


def test_failing_write_leaves_no_partial_result(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})

    def write(conn: sa.Connection) -> None:
        aggregate.write(conn)
        raise RuntimeError("boom in the user's write")

    with pytest.raises(RuntimeError, match="boom"):
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], write)
    assert aggregate.value() == 0
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}


def test_users_own_missing_table_is_not_reported_as_ours(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})

    def write(conn: sa.Connection) -> None:
        conn.execute(sa.text("INSERT INTO no_such_results_table VALUES (1)"))

    # the user's own error, named as such (WriteFailed, not SchemaMissing), with the table it names
    with pytest.raises(WriteFailed, match="no_such_results_table") as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], write)
    assert info.value.sqlstate == "42P01"
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}


def test_unknown_job(engine: sa.Engine, migrated: DatabaseSettings, store: Store) -> None:
    with pytest.raises(UnknownJob, match="ghost"):
        commit_ranges(store, Run("ghost", 1, "r"), [OffsetRange("t", 0, 0, 5)])


def test_missing_schema_is_a_clear_error(engine: sa.Engine, db: DatabaseSettings) -> None:
    with pytest.raises(SchemaMissing) as info:
        commit_ranges(Store(engine, db), Run("j", 1, "r"), [OffsetRange("t", 0, 0, 5)])
    assert db.schema in str(info.value)
    assert "txn-offsets db upgrade" in str(info.value)


@pytest.mark.parametrize(
    ("ranges", "problem"),
    [
        ([], "non-empty"),
        ([("t", 0, 0, 1)], "is not an OffsetRange"),
        ([OffsetRange("t", 0, 0, 1), OffsetRange("t", 0, 1, 2)], "appears twice"),
    ],
)
def test_bad_ranges_change_nothing(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    run: Run,
    ranges: list[OffsetRange],
    problem: str,
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    with pytest.raises(ConfigError, match=problem):
        commit_ranges(store, run, ranges)
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}


def test_bad_options(engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run) -> None:
    rng = [OffsetRange("t", 0, 0, 1)]
    with pytest.raises(ConfigError, match="isolation_level"):
        commit_ranges(store, run, rng, isolation_level="READ UNCOMMITTED")
    with pytest.raises(ConfigError, match="max_attempts"):
        commit_ranges(store, run, rng, max_attempts=0)


def test_serialization_failures_exhaust_into_commit_not_applied(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    attempts = 0

    def write(conn: sa.Connection) -> None:
        nonlocal attempts
        attempts += 1
        # what SERIALIZABLE raises when it must abort a transaction: SQLSTATE 40001
        conn.execute(sa.text("DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '40001'; END $$"))

    with pytest.raises(CommitNotApplied, match="sqlstate 40001") as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], write, max_attempts=3)
    assert attempts == 3
    assert info.value.job == run.job
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}
    assert aggregate.value() == 0


def test_unguarded_commit_writes_without_claiming(ctx: Ctx) -> None:
    """The benchmarks' at-least-once baseline (benchmarks/alo.py, outside the product): the same
    transaction, no claim, no offset moved."""
    from benchmarks.alo import write_unguarded
    from tests.unproven import NO_RECORDS
    from txn_offsets.commit import Unit

    seed(ctx.engine, ctx.db, ctx.run.job, {("t", 0): 0})
    unit = Unit(ctx.run, [OffsetRange("t", 0, 0, 5)], ctx.agg.write, source=NO_RECORDS)
    for _ in range(2):  # a replay is applied again: nothing guards it
        (out,) = write_unguarded(ctx.engine, unit, "READ COMMITTED")
        assert out.outcome is Outcome.COMMITTED
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 0}
    assert ctx.agg.value() == 2
