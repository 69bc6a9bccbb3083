"""No silent exits at the store level (issue 9): an aborted transaction is never committed blind, a
blocked claim fails with a named retryable error, a data-loss skip cannot be made by a fenced
run, and the migration that adds topic ids keeps existing jobs right."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import sqlalchemy as sa

from tests.integration.conftest import Ctx
from tests.integration.helpers import offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets import ClaimBlocked, Fenced, JobAlreadyRunning, TransactionAborted
from txn_offsets.commit.claim import claim_ranges
from txn_offsets.commit.classify import ClaimResult
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import migrate, offset_rows
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


# Item 4. Before: COMMIT of the aborted transaction was a silent ROLLBACK reported as COMMITTED.
def test_a_write_that_swallows_a_database_error_is_never_committed(ctx: Ctx) -> None:
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", 0): 0})

    def swallowing(conn: sa.Connection) -> None:
        ctx.agg.write(conn)
        # the user's code "handles" it; PostgreSQL has aborted the transaction anyway
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.execute(sa.text("SELECT 1 / 0"))

    with pytest.raises(TransactionAborted, match="begin_nested"):
        commit_ranges(ctx.store, ctx.run, [OffsetRange("t", 0, 0, 5)], swallowing)
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 0}
    assert ctx.agg.value() == 0


def test_an_error_recovered_in_a_savepoint_commits(ctx: Ctx) -> None:
    """The documented way to survive an expected error: the transaction stays healthy."""
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", 0): 0})

    def careful(conn: sa.Connection) -> None:
        ctx.agg.write(conn)
        try:
            with conn.begin_nested():
                conn.execute(sa.text("SELECT 1 / 0"))
        except sa.exc.DBAPIError:
            pass

    commit_ranges(ctx.store, ctx.run, [OffsetRange("t", 0, 0, 5)], careful)
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 5}
    assert ctx.agg.value() == 1


# Item 6. Before: no lock_timeout anywhere, so a claim behind a frozen holder waited for hours.
def test_a_claim_behind_a_held_row_fails_with_claim_blocked(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    quick = DatabaseSettings(migrated.url, schema=migrated.schema, lock_timeout_s=0.5)
    quick_engine = engine_for(quick)
    try:
        with engine.connect() as frozen, frozen.begin():
            # a task that claimed and then froze before COMMIT
            assert (
                claim_ranges(frozen, migrated, run, [OffsetRange("t", 0, 0, 5)], record=False)[0]
                is ClaimResult.CLAIMED
            )
            t0 = time.monotonic()
            with pytest.raises(ClaimBlocked) as info:
                commit_ranges(Store(quick_engine, quick), run, [OffsetRange("t", 0, 0, 5)])
            assert time.monotonic() - t0 < 10
            assert info.value.timeout_s == 0.5 and "t[0]" in info.value.ranges
            frozen.rollback()
        # the holder is gone: the same claim now goes through
        commit_ranges(Store(quick_engine, quick), run, [OffsetRange("t", 0, 0, 5)])
    finally:
        quick_engine.dispose()
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5}


def test_an_idle_claim_holder_is_ended_by_the_server(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    """idle_in_transaction_timeout_s: the server ends a session that claimed and went silent."""
    seed(engine, migrated, run.job, {("t", 0): 0})
    quick = DatabaseSettings(migrated.url, schema=migrated.schema, idle_in_transaction_timeout_s=1)
    quick_engine = engine_for(quick, poolclass=sa.pool.NullPool)
    try:
        with quick_engine.connect() as frozen:
            frozen.begin()
            claim_ranges(frozen, migrated, run, [OffsetRange("t", 0, 0, 5)], record=False)[0]
            time.sleep(2.5)  # frozen: no statement, no COMMIT
            with pytest.raises(sa.exc.DBAPIError):
                frozen.execute(sa.text("SELECT 1"))
    finally:
        quick_engine.dispose()
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}  # rolled back by the server
    commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5}


# Item 7. Before: skip_lost read the generation without a lock; a new run could bump it between the
# check and the move, and the fenced run's skip still committed.
def test_a_data_loss_skip_holds_the_job_row_against_a_new_run(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 10})
    outcome: dict[str, object] = {}
    with engine.connect() as planner, planner.begin():
        assert offset_rows.skip_lost(
            planner, migrated, run.job, "t", 0, 10, 50, "retention", generation=run.generation
        )

        def new_run() -> None:
            try:
                outcome["run"] = start_run(Store(engine, migrated), run.job, force=True, lock_timeout_s=0.5)
            except JobAlreadyRunning as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=new_run)
        thread.start()
        thread.join(timeout=30)
        # the bump had to wait for the skip's transaction (FOR KEY SHARE vs FOR UPDATE)
        assert isinstance(outcome.get("error"), JobAlreadyRunning), outcome
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 50}
    newer = start_run(Store(engine, migrated), run.job, force=True)
    with pytest.raises(Fenced), engine.begin() as conn:
        offset_rows.skip_lost(conn, migrated, run.job, "t", 0, 50, 60, "retention", generation=run.generation)
    assert newer.generation == run.generation + 1
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 50}


def test_seeding_by_a_fenced_run_is_refused(engine: sa.Engine, migrated: DatabaseSettings, run: Run) -> None:
    start_run(Store(engine, migrated), run.job, force=True)
    with pytest.raises(Fenced), engine.begin() as conn:
        offset_rows.seed_offsets(
            conn, migrated, run.job, {("t", 0): 0}, reason="x", actor="planner", generation=run.generation
        )
    assert offsets_of(engine, migrated, run.job) == {}


def test_migration_0003_keeps_existing_jobs_planned(engine: sa.Engine, db: DatabaseSettings) -> None:
    """An 0002 store with a job that has offsets: after 0003 the job counts as planned (so a topic
    it meets later starts at the log start) and rows keep no topic id until the next plan."""
    migrate.upgrade(db, "0002")
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO \"{db.schema}\".jobs (job) VALUES ('old'), ('empty')"))
        conn.execute(
            sa.text(f"INSERT INTO \"{db.schema}\".offsets (job, topic, part, off) VALUES ('old', 't', 0, 7)")
        )
    assert migrate.upgrade(db) == migrate.head()
    migrate.check(db)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f'SELECT job, first_plan_at IS NOT NULL AS planned FROM "{db.schema}".jobs')
        )
        planned = {r.job: r.planned for r in rows}
        ids = conn.execute(sa.text(f'SELECT topic_id FROM "{db.schema}".offsets')).scalars().all()
    assert planned == {"old": True, "empty": False}
    assert ids == [None]
    with engine.begin() as conn:  # the new audit action is accepted
        offset_rows.seed_offsets(conn, db, "old", {("u", 0): 0}, action="new_topic", reason="r", actor="a")
    assert migrate.downgrade(db, "0002") == "0002"
    with engine.connect() as conn:
        actions = conn.execute(sa.text(f'SELECT action FROM "{db.schema}".offset_audit')).scalars().all()
    assert actions == ["seed"]  # recorded as what the old schema knows
    assert migrate.upgrade(db) == migrate.head()


def test_a_reset_forgets_the_topic_incarnation(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    """After a topic was re-created, an admin reset is how one recovers: the reset offsets belong to
    the topic as it is now, so the old topic id must not make the next plan report data loss again."""
    with engine.begin() as conn:
        offset_rows.seed_offsets(
            conn, migrated, run.job, {("t", 0): 40}, reason="r", actor="a", topic_ids={"t": "old-id"}
        )
        assert offset_rows.load_rows(conn, migrated, run.job)[("t", 0)].topic_id == "old-id"
        offset_rows.reset_offsets(conn, migrated, run.job, {("t", 0): 0}, reason="re-created", actor="a")
        assert offset_rows.load_rows(conn, migrated, run.job)[("t", 0)] == offset_rows.StoredOffset(0, None)
