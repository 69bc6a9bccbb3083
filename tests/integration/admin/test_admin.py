"""Audited offset moves outside batch commits: seed, data-loss skip, admin reset; bad inputs."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of, seed
from txn_offsets import ConfigError, Fenced, OffsetConflict, UnknownJob
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run
from txn_offsets.store.schema import tables_for


def _audit(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[object, ...]]:
    a = tables_for(db.schema).audit
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(a.c.topic, a.c.part, a.c.old_off, a.c.new_off, a.c.action, a.c.reason, a.c.actor)
            .where(a.c.job == job)
            .order_by(a.c.id)
        )
        return [tuple(r) for r in rows]


def test_seed_inserts_missing_rows_only_and_audits_them(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 5})
    with engine.begin() as conn:
        inserted = offset_rows.seed_offsets(
            conn,
            migrated,
            run.job,
            {("t", 0): 99, ("t", 1): 7},
            action="new_partition",
            reason="r",
            actor="me",
        )
    assert inserted == {("t", 1): 7}  # the existing row wins
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5, ("t", 1): 7}
    assert _audit(engine, migrated, run.job) == [
        ("t", 0, None, 5, "seed", "test", "pytest"),
        ("t", 1, None, 7, "new_partition", "r", "me"),
    ]


@pytest.mark.parametrize(
    ("offsets", "kwargs", "problem"),
    [
        ({("t", 0): -1}, {}, "offset"),
        ({("t", -1): 0}, {}, "partition"),
        ({("", 0): 0}, {}, "topic"),
        ({("t", 0): 1}, {"action": "delete"}, "action"),
        ({("t", 0): 1}, {"reason": " "}, "reason"),
    ],
)
def test_bad_seeds_change_nothing(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    run: Run,
    offsets: dict[tuple[str, int], int],
    kwargs: dict[str, str],
    problem: str,
) -> None:
    args = {"reason": "r", "actor": "me", **kwargs}
    with pytest.raises(ConfigError, match=problem), engine.begin() as conn:
        offset_rows.seed_offsets(conn, migrated, run.job, offsets, **args)
    assert offsets_of(engine, migrated, run.job) == {}
    assert _audit(engine, migrated, run.job) == []


def test_seed_for_unknown_job(engine: sa.Engine, migrated: DatabaseSettings) -> None:
    with pytest.raises(UnknownJob), engine.begin() as conn:
        offset_rows.seed_offsets(conn, migrated, "nobody", {("t", 0): 0}, reason="r", actor="me")


def test_skip_lost_is_audited_and_idempotent(engine: sa.Engine, migrated: DatabaseSettings, run: Run) -> None:
    seed(engine, migrated, run.job, {("t", 0): 10})
    with engine.begin() as conn:
        assert (
            offset_rows.skip_lost(conn, migrated, run.job, "t", 0, 10, 50, "retention", actor="planner")
            is True
        )
    with engine.begin() as conn:  # a retry of the same skip
        assert (
            offset_rows.skip_lost(conn, migrated, run.job, "t", 0, 10, 50, "retention", actor="planner")
            is False
        )
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 50}
    assert _audit(engine, migrated, run.job)[-1] == ("t", 0, 10, 50, "data_loss_skip", "retention", "planner")
    with pytest.raises(OffsetConflict), engine.begin() as conn:
        offset_rows.skip_lost(conn, migrated, run.job, "t", 0, 20, 60, "retention")
    with pytest.raises(ConfigError, match="only moves forward"), engine.begin() as conn:
        offset_rows.skip_lost(conn, migrated, run.job, "t", 0, 50, 40, "retention")
    with pytest.raises(Fenced), engine.begin() as conn:
        offset_rows.skip_lost(
            conn, migrated, run.job, "t", 0, 50, 60, "retention", generation=run.generation - 1
        )
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 50}


def test_reset_moves_audits_and_fences(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 10, ("t", 1): 20})
    with engine.begin() as conn:
        changes = offset_rows.reset_offsets(
            conn, migrated, run.job, {("t", 0): 0, ("u", 0): 3}, reason="replay", actor="ops"
        )
    assert [(c.topic, c.partition, c.old, c.new) for c in changes] == [("t", 0, 10, 0), ("u", 0, None, 3)]
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0, ("t", 1): 20, ("u", 0): 3}
    assert _audit(engine, migrated, run.job)[-2:] == [
        ("t", 0, 10, 0, "reset", "replay", "ops"),
        ("u", 0, None, 3, "reset", "replay", "ops"),
    ]
    from tests.unproven import commit_ranges
    from txn_offsets.ranges import OffsetRange

    with pytest.raises(Fenced):  # the run that planned from the old offsets is fenced
        commit_ranges(store, run, [OffsetRange("t", 1, 20, 30)])


def test_reset_refuses_negative_offsets(engine: sa.Engine, migrated: DatabaseSettings, run: Run) -> None:
    seed(engine, migrated, run.job, {("t", 0): 10})
    with pytest.raises(ConfigError, match="offset"), engine.begin() as conn:
        offset_rows.reset_offsets(conn, migrated, run.job, {("t", 0): -5}, reason="x", actor="ops")
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 10}


def test_database_refuses_negative_offsets_even_from_raw_sql(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 10})
    o = tables_for(migrated.schema).offsets
    with pytest.raises(sa.exc.IntegrityError, match="off_nonneg"), engine.begin() as conn:
        conn.execute(sa.update(o).values(off=-1))
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 10}
