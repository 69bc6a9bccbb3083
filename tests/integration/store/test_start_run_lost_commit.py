"""start_run when its COMMIT is lost (a failover, a dropped connection): the run cannot tell from
the error whether its new generation committed. Its run id is the token: start_run re-reads the
job row and our own row means the start committed (continue), the generation we locked means it did
not (start again), anything else means another run took the job (Fenced).

The COMMIT is lost deterministically by a proxy (tests/integration/commit/commit_cut.py) in front of the
stack's PostgreSQL: "drop" never forwards it (rolled back), "cut" forwards it and hangs up on the
client once the server has answered (committed, acknowledgement lost).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.integration.commit.commit_cut import commit_cut
from tests.integration.helpers import offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Fenced
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, end_run, start_run
from txn_offsets.store.schema import tables_for

MARKER = b"SET generation = j.generation + 1"  # start_run's bump of the generation (start_runs' statement)


def _job_row(engine: sa.Engine, db: DatabaseSettings, job: str) -> tuple[int, str | None, bool]:
    jobs = tables_for(db.schema).jobs
    live = sa.and_(jobs.c.run_id.is_not(None), jobs.c.lease_until > sa.func.now())
    with engine.connect() as conn:
        row = conn.execute(sa.select(jobs.c.generation, jobs.c.run_id, live).where(jobs.c.job == job)).one()
    return int(row[0]), row[1], bool(row[2])


def _earlier_run(engine: sa.Engine, db: DatabaseSettings, job: str) -> Run:
    run = start_run(Store(engine, db), job)
    seed(engine, db, job, {("t", 0): 0})
    assert end_run(Store(engine, db), run)
    return run


@pytest.mark.parametrize("mode", ["drop", "cut"])
def test_start_run_whose_commit_is_lost_starts_exactly_once(
    mode: str, database_url: str, engine: sa.Engine, migrated: DatabaseSettings, store: Store, job_name: str
) -> None:
    earlier = _earlier_run(engine, migrated, job_name)
    with commit_cut(database_url, MARKER, mode) as proxy:
        db = DatabaseSettings(Secret(proxy.url(database_url)), schema=migrated.schema)
        through = engine_for(db)
        try:
            run = start_run(Store(through, db), job_name)
        finally:
            through.dispose()
    assert proxy.fired.is_set()
    assert proxy.answered.is_set() is (mode == "cut")  # "cut": the lost COMMIT was applied
    # one new generation, ours, whether the lost COMMIT was applied or not
    assert run.generation == earlier.generation + 1
    assert _job_row(engine, migrated, job_name) == (run.generation, run.run_id, True)
    done = commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)])
    assert [d.outcome for d in done] == [Outcome.COMMITTED]
    assert offsets_of(engine, migrated, job_name) == {("t", 0): 5}


def test_start_run_whose_lost_commit_was_overtaken_is_fenced(
    database_url: str, engine: sa.Engine, migrated: DatabaseSettings, store: Store, job_name: str
) -> None:
    """The lost start committed, and another run started before this one could re-read: the job is
    the other run's. Fenced, and the other run keeps the job."""
    earlier = _earlier_run(engine, migrated, job_name)
    other: list[Run] = []

    def another_run_starts() -> None:
        other.append(start_run(store, job_name, force=True))

    with commit_cut(database_url, MARKER, "cut", on_lost=another_run_starts) as proxy:
        db = DatabaseSettings(Secret(proxy.url(database_url)), schema=migrated.schema)
        through = engine_for(db)
        try:
            with pytest.raises(Fenced) as fenced:
                start_run(Store(through, db), job_name)
        finally:
            through.dispose()
    assert proxy.answered.is_set()
    (winner,) = other
    assert winner.generation == earlier.generation + 2  # ours (lost) was +1
    assert (fenced.value.generation, fenced.value.current) == (earlier.generation + 1, winner.generation)
    assert _job_row(engine, migrated, job_name) == (winner.generation, winner.run_id, True)
    done = commit_ranges(store, winner, [OffsetRange("t", 0, 0, 5)])
    assert [d.outcome for d in done] == [Outcome.COMMITTED]
