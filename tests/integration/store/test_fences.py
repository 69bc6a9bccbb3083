"""What the store shows of a fence (store/fences.py) where the job row no longer does: a bump made
since by yet another run, a retire of a job without offset rows, a store that does not answer."""

from __future__ import annotations

import sqlalchemy as sa

from tests.integration.helpers import seed
from tests.unproven import commit_ranges
from txn_offsets.admin.retire import retire_job
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Fenced, FencedBy, RunCommitted
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.fences import explain_fence
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


def _explain(store: Store, run: Run, batches: int = 1) -> Fenced:
    with store.connect() as conn:
        current = int(
            conn.execute(
                sa.text(f'SELECT generation FROM "{store.schema}".jobs WHERE job = :j'), {"j": run.job}
            ).scalar_one()
        )
    return explain_fence(store, run, Fenced(run.job, run.generation, current), batches=batches, running_s=60)


def test_a_newer_run_overtaken_since_is_found_by_its_lineage(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    store = Store(engine, migrated)
    seed(engine, migrated, run.job, {("t", 0): 0})
    commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])
    newer = start_run(store, run.job, force=True)
    commit_ranges(store, newer, [OffsetRange("t", 0, 5, 9)])
    start_run(store, run.job, force=True)  # generation 3: the job row forgets generation 2's run
    err = _explain(store, run)
    assert err.by == FencedBy("run", run.generation + 1, newer.run_id)
    assert err.committed == RunCommitted(run.run_id, 1, ranges=1, through=(("t", 0, 5),))
    assert f"(generation {run.generation + 1}, run {newer.run_id}) (the job is at generation " in str(err)


def test_a_bump_the_store_does_not_show_is_not_guessed(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    store = Store(engine, migrated)
    start_run(store, run.job, force=True)  # generation 2 commits nothing, and generation 3 follows
    start_run(store, run.job, force=True)
    err = _explain(store, run, batches=0)
    assert err.by is None
    assert (
        "was fenced by generation 3 (a newer run, an offsets reset, an offsets import or jobs retire"
        in str(err)
    )
    assert "This run (" in str(err) and "had committed nothing before it." in str(err)


def test_a_retire_of_a_job_without_offset_rows_is_named(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    store = Store(engine, migrated)
    retired = retire_job(store, run.job, reason="never used", actor="ops@h", force=True)
    err = _explain(store, run)
    assert err.by == FencedBy("retire", run.generation + 1, at=retired.retired_at)


def test_a_store_that_does_not_answer_leaves_the_fence_as_it_was(
    migrated: DatabaseSettings, run: Run
) -> None:
    bare = Fenced(run.job, run.generation, run.generation + 1)
    gone = sa.create_engine("postgresql+psycopg://u@127.0.0.1:1/x", connect_args={"connect_timeout": 2})
    try:
        err = explain_fence(Store(gone, migrated), run, bare, batches=0, running_s=1)
    finally:
        gone.dispose()
    assert err is bare and err.by is None and err.committed is None
