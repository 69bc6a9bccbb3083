"""Many runs' units committed in one transaction (txn_offsets.commit.commit_units: a shared round's
Spark task).

All or nothing: every unit claimed under its own run and written, then ONE COMMIT; any unit that is
not (already committed, in conflict, fenced, a write that raises or aborts the transaction) leaves
nothing of the joint transaction committed, and each unit is then committed alone through the same
shell, where it gets what it always got (the others commit, each in a transaction of its own). A lost
COMMIT (tests/integration/commit/commit_cut.py: "drop" not applied, "cut" applied and unacknowledged) is
settled from each unit's rows, never guessed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.integration.commit.commit_cut import commit_cut
from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import NO_RECORDS, commit_ranges
from txn_offsets.commit import Outcome, Unit, commit_units
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import (
    CommitNotApplied,
    ConfigError,
    Fenced,
    OffsetConflict,
    TransactionAborted,
    WriteFailed,
)
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run, start_run

MARKER = b"SET off = w.until_off"  # the claim statement: the joint transaction's COMMIT is lost

JOBS = 3


def _runs(engine: sa.Engine, db: DatabaseSettings, job_name: str) -> list[Run]:
    runs = []
    for i in range(JOBS):
        run = start_run(Store(engine, db), f"{job_name}-{i}")
        seed(engine, db, run.job, {("t", 0): 0, ("t", 1): 0})
        runs.append(run)
    return runs


def _units(runs: list[Run], agg: Aggregate, *, until: int = 5) -> list[Unit]:
    return [
        Unit(
            run,
            [OffsetRange("t", 1, 0, until), OffsetRange("t", 0, 0, until)],
            agg.write,
            Lineage(7),
            source=NO_RECORDS,
        )
        for run in runs
    ]


def _xmins(engine: sa.Engine, db: DatabaseSettings, table: str, jobs: list[str]) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f'SELECT xmin::text FROM "{db.schema}".{table} WHERE job = ANY(:jobs)'), {"jobs": jobs}
        ).scalars()
        return set(rows)


def test_units_of_many_runs_commit_in_one_transaction(
    engine: sa.Engine, migrated: DatabaseSettings, aggregate: Aggregate, job_name: str
) -> None:
    runs = _runs(engine, migrated, job_name)
    units = _units(runs, aggregate)
    settled = commit_units(engine, migrated, units)
    for unit, outcomes in zip(units, settled, strict=True):
        assert isinstance(outcomes, list)
        assert [(o.range, o.outcome) for o in outcomes] == [(r, Outcome.COMMITTED) for r in unit.ranges]
        assert offsets_of(engine, migrated, unit.run.job) == {("t", 0): 5, ("t", 1): 5}
    assert aggregate.value() == JOBS  # each unit's write, once
    jobs = [r.job for r in runs]
    # one transaction: every claimed offset row and every lineage row has the same xmin
    assert len(_xmins(engine, migrated, "offsets", jobs)) == 1
    assert _xmins(engine, migrated, "commits", jobs) == _xmins(engine, migrated, "offsets", jobs)
    with engine.connect() as conn:
        lineage = conn.execute(
            sa.text(f'SELECT job, run_id, batch FROM "{migrated.schema}".commits WHERE job = ANY(:jobs)'),
            {"jobs": jobs},
        ).all()
    assert sorted(lineage) == sorted((r.job, r.run_id, 7) for r in runs for _ in range(2))
    # committed again (a retried task): the joint transaction gives way, and each unit alone finds
    # its ranges committed: nothing written
    for again in commit_units(engine, migrated, units):
        assert isinstance(again, list)
        assert {o.outcome for o in again} == {Outcome.ALREADY_COMMITTED}
    assert aggregate.value() == JOBS


def _already(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    commit_ranges(Store(engine, db), unit.run, unit.ranges, agg.write)  # its batch committed before
    return unit


def _conflict(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    commit_ranges(Store(engine, db), unit.run, [OffsetRange("t", 0, 0, 3)])  # another range moved one row
    return unit


def _fenced(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    start_run(Store(engine, db), unit.run.job, force=True)  # a newer run took the job
    return unit


def _raising(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    def write(conn: sa.Connection) -> None:
        agg.write(conn)
        raise RuntimeError("the user's write failed")

    return Unit(unit.run, unit.ranges, write, unit.lineage, source=unit.source)


def _aborting(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    def write(conn: sa.Connection) -> None:
        agg.write(conn)
        # a write that catches a database error: PostgreSQL has aborted the transaction
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.execute(sa.text("SELECT 1/0"))

    return Unit(unit.run, unit.ranges, write, unit.lineage, source=unit.source)


def _failing_sql(engine: sa.Engine, db: DatabaseSettings, unit: Unit, agg: Aggregate) -> Unit:
    def write(conn: sa.Connection) -> None:
        conn.execute(sa.text(f'INSERT INTO "{db.schema}".agg (id, n) VALUES (1, 0)'))  # duplicate key

    return Unit(unit.run, unit.ranges, write, unit.lineage, source=unit.source)


# what happens to the middle unit, and what it meets when committed alone afterwards
CASES: dict[str, tuple[Callable[..., Unit], object]] = {
    "already committed": (_already, Outcome.ALREADY_COMMITTED),
    "conflict": (_conflict, OffsetConflict),
    "fenced": (_fenced, Fenced),
    "write raises": (_raising, RuntimeError),
    "write aborts the transaction": (_aborting, TransactionAborted),
    "write fails in SQL": (_failing_sql, WriteFailed),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_unit_not_claimed_or_written_commits_nothing_of_any_unit(
    case: str, engine: sa.Engine, migrated: DatabaseSettings, aggregate: Aggregate, job_name: str
) -> None:
    make, alone = CASES[case]
    runs = _runs(engine, migrated, job_name)
    units = _units(runs, aggregate)
    units[1] = make(engine, migrated, units[1], aggregate)
    before = {r.job: offsets_of(engine, migrated, r.job) for r in runs}
    value = aggregate.value()
    results = commit_units(engine, migrated, units)
    # each unit alone: the others commit, the odd one meets what it always met
    for i, result in enumerate(results):
        if i == 1 and isinstance(alone, type):
            assert isinstance(result, alone)
            continue
        assert isinstance(result, list)
        assert {o.outcome for o in result} == {alone if i == 1 else Outcome.COMMITTED}
    assert offsets_of(engine, migrated, runs[1].job) == before[runs[1].job]
    for i in (0, 2):
        assert offsets_of(engine, migrated, runs[i].job) == {("t", 0): 5, ("t", 1): 5}
    # nothing of the joint transaction stayed: the two others committed in transactions of their own,
    # and only their writes count (the odd unit's write, once in the joint one, was rolled back)
    assert len(_xmins(engine, migrated, "offsets", [runs[0].job, runs[2].job])) == 2
    assert aggregate.value() == value + 2


@pytest.mark.parametrize("mode", ["drop", "cut"])
def test_a_lost_joint_commit_is_settled_from_each_units_rows(
    mode: str,
    database_url: str,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    aggregate: Aggregate,
    job_name: str,
) -> None:
    runs = _runs(engine, migrated, job_name)
    units = _units(runs, aggregate)
    with commit_cut(database_url, MARKER, mode) as proxy:
        db = DatabaseSettings(Secret(proxy.url(database_url)), schema=migrated.schema)
        through = engine_for(db)
        try:
            settled = commit_units(through, db, units)
        finally:
            through.dispose()
    assert proxy.fired.is_set() and proxy.answered.is_set() is (mode == "cut")
    assert len(settled) == JOBS
    for unit, outcome in zip(units, settled, strict=True):
        if mode == "cut":  # applied: every unit committed, as its rows show
            assert isinstance(outcome, list)
            assert {o.outcome for o in outcome} == {Outcome.COMMITTED}
            assert offsets_of(engine, migrated, unit.run.job) == {("t", 0): 5, ("t", 1): 5}
        else:  # not applied: every unit is CommitNotApplied, its rows unchanged
            assert isinstance(outcome, CommitNotApplied)
            assert offsets_of(engine, migrated, unit.run.job) == {("t", 0): 0, ("t", 1): 0}
    assert aggregate.value() == (JOBS if mode == "cut" else 0)


def test_bad_units_are_left_to_commit_alone(
    engine: sa.Engine, migrated: DatabaseSettings, aggregate: Aggregate, job_name: str
) -> None:
    runs = _runs(engine, migrated, job_name)
    units = _units(runs, aggregate)
    units[2] = Unit(runs[2], [], aggregate.write, source=NO_RECORDS)  # no ranges: a ConfigError, alone
    results = commit_units(engine, migrated, units)
    assert isinstance(results[2], ConfigError) and "non-empty sequence of OffsetRange" in str(results[2])
    assert all(isinstance(r, list) for r in results[:2])
    assert offsets_of(engine, migrated, runs[2].job) == {("t", 0): 0, ("t", 1): 0}
    assert aggregate.value() == 2
