"""stream_plans: one reader owns a run's streaming batches, a new batch needs the previous one
committed, the sink commits only the batch it loaded, and a fenced sink says Fenced."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.integration.helpers import seed
from tests.unproven import commit_ranges
from txn_offsets import Fenced, StreamDiverged
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run
from txn_offsets.store.stream_plans import (
    become_reader,
    check_committed,
    load_plan,
    mark_committed,
    save_plan,
)

FIRST = (OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 5))
SECOND = (OffsetRange("t", 0, 10, 20),)


def test_one_reader_plans_and_the_sink_commits_the_batch_it_loaded(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    db = migrated
    store = Store(engine, db)
    seed(engine, db, run.job, {("t", 0): 0, ("t", 1): 0})
    become_reader(store, run, "reader-a")
    assert load_plan(store, run).ranges == ()  # a query's first batch may have nothing planned
    with pytest.raises(StreamDiverged, match="another streaming query reads this run's stream"):
        become_reader(store, run, "reader-b")
    save_plan(store, run, "reader-a", FIRST)
    save_plan(store, run, "reader-a", FIRST)  # Spark planning the same batch again: no change
    with pytest.raises(StreamDiverged, match="another streaming query"):
        save_plan(store, run, "reader-b", SECOND)
    with pytest.raises(StreamDiverged, match="previous one is not committed"):
        save_plan(store, run, "reader-a", SECOND)
    with pytest.raises(StreamDiverged, match=r"the previous batch was not committed \(2 range"):
        check_committed(store, run, "reader-a", FIRST)
    plan = load_plan(store, run)
    assert (plan.ranges, plan.committed) == (FIRST, False)
    outcomes = commit_ranges(store, run, FIRST, lambda conn: mark_committed(conn, db, run, FIRST))
    assert {o.outcome for o in outcomes} == {Outcome.COMMITTED}
    check_committed(store, run, "reader-a", FIRST)  # now it may plan past it
    save_plan(store, run, "reader-a", SECOND)
    # a sink holding a stale batch commits nothing: the whole transaction rolls back
    seed(engine, db, run.job, {("t", 2): 0})
    stale = (OffsetRange("t", 2, 0, 3),)
    with pytest.raises(StreamDiverged, match="changed while the sink was committing"):
        commit_ranges(store, run, stale, lambda conn: mark_committed(conn, db, run, stale))
    with engine.connect() as conn:
        off = conn.execute(
            sa.text(f'SELECT off FROM "{db.schema}".offsets WHERE job = :j AND part = 2'), {"j": run.job}
        ).scalar_one()
    assert off == 0


def test_a_sink_of_a_fenced_run_says_fenced(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    become_reader(store, run, "reader-a")
    newer = start_run(store, run.job, force=True)
    become_reader(store, newer, "reader-c")
    with pytest.raises(Fenced) as err:
        load_plan(store, run)
    assert (err.value.generation, err.value.current) == (run.generation, newer.generation)
    with pytest.raises(Fenced):
        become_reader(store, run, "reader-a")
