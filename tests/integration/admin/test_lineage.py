"""Lineage of every commit (``commits``): one row per committed range, written in the claim's
transaction; ``offsets history --partition`` and ``offsets explain`` read it; retention prunes it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from benchmarks.alo import write_unguarded
from tests.integration.helpers import Aggregate, Cli, seed
from tests.unproven import NO_RECORDS, commit_ranges
from txn_offsets import ConfigError
from txn_offsets.commit import Outcome, Unit
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store import lineage, migrate, offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run
from txn_offsets.store.schema import run_role_grants

T0 = 1_700_000_000_000  # a record timestamp, ms


def commits(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    f"SELECT topic, part, from_off, until_off, generation, run_id, batch, first_record_at, "
                    f'last_record_at FROM "{db.schema}".commits WHERE job = :j ORDER BY id'
                ),
                {"j": job},
            )
        ]


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def test_each_committed_range_is_recorded_once_in_its_transaction(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0, ("t", 1): 0})
    one = lineage.Lineage(batch=1, timestamps={("t", 0): (T0, T0 + 900)})
    batch = [OffsetRange("t", 1, 0, 5), OffsetRange("t", 0, 0, 10)]
    assert {o.outcome for o in commit_ranges(store, run, batch, aggregate.write, lineage=one)} == {
        Outcome.COMMITTED
    }
    rng = OffsetRange("t", 0, 10, 20)
    out = commit_ranges(store, run, [rng], aggregate.write, lineage=lineage.Lineage(batch=2))
    assert out[0].outcome is Outcome.COMMITTED
    # a retried attempt of a committed range: already_committed, no second row
    again = commit_ranges(store, run, [rng], aggregate.write, lineage=lineage.Lineage(batch=2))
    assert again[0].outcome is Outcome.ALREADY_COMMITTED

    # a write that fails rolls the claim and the lineage row back together
    def failing(conn: sa.Connection) -> None:
        aggregate.write(conn)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        commit_ranges(store, run, [OffsetRange("t", 0, 20, 30)], failing)
    # the benchmark mode without the guard claims nothing and records nothing
    unguarded = Unit(run, [OffsetRange("t", 1, 5, 6)], aggregate.write, source=NO_RECORDS)
    write_unguarded(engine, unguarded, "READ COMMITTED")
    # a commit without lineage details still gets its row (batch and timestamps unknown)
    commit_ranges(store, run, [OffsetRange("t", 1, 5, 8)], aggregate.write)

    g, r = run.generation, run.run_id
    assert commits(engine, migrated, run.job) == [
        ("t", 0, 0, 10, g, r, 1, _ts(T0), _ts(T0 + 900)),
        ("t", 1, 0, 5, g, r, 1, None, None),
        ("t", 0, 10, 20, g, r, 2, None, None),
        ("t", 1, 5, 8, g, r, None, None, None),
    ]
    assert aggregate.value() == 4  # 2 + 1 (guarded) + 1 (unguarded): the rows match the results


def test_history_and_explain_answer_from_the_lineage(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    s = ["--schema", migrated.schema]
    seed(engine, migrated, run.job, {("t", 0): 100, ("t", 1): 0})
    lin = lineage.Lineage(batch=7, timestamps={("t", 0): (T0, T0 + 5)})
    commit_ranges(store, run, [OffsetRange("t", 0, 100, 110)], aggregate.write, lineage=lin)
    commit_ranges(store, run, [OffsetRange("t", 0, 110, 130)], aggregate.write)
    with engine.begin() as conn:  # an admin skips 130 -> 150 (audited, generation bumped)
        offset_rows.reset_offsets(conn, migrated, run.job, {("t", 0): 150}, reason="skip junk", actor="ops")

    code, out, _ = run_cli("offsets", "history", "--job", run.job, "--partition", "0", "--format", "json", *s)
    assert code == 0
    rows = json.loads(out)
    assert [(r["action"], r["old"], r["new"], r["batch"]) for r in rows] == [  # newest first
        ("reset", 130, 150, None),
        ("commit", 110, 130, None),
        ("commit", 100, 110, 7),
        ("seed", None, 100, None),
    ]
    assert rows[2]["run_id"] == run.run_id and rows[2]["generation"] == run.generation
    assert rows[2]["first_record_at"] == _ts(T0).isoformat()
    code, out, _ = run_cli("offsets", "history", "--job", run.job, "--partition", "0", *s)
    assert code == 0 and " commit " in out and run.run_id in out and "skip junk" in out

    def explain(offset: int, partition: int = 0) -> tuple[int, str, str]:
        argv = ["offsets", "explain", "--job", run.job, "--topic", "t", "--partition", str(partition)]
        return run_cli(*argv, "--offset", str(offset), *s)

    code, out, _ = explain(104)
    assert code == 0
    assert out.startswith("t[0] offset 104: committed in [100, 110) by run ")
    assert run.run_id in out and "batch 7" in out and f"generation {run.generation}" in out
    code, out, _ = explain(129)
    assert code == 0 and "committed in [110, 130)" in out and "batch unknown" in out
    code, out, _ = explain(140)
    assert code == 0 and "skipped" in out and "reset" in out and "skip junk" in out
    code, out, _ = explain(150)
    assert code == 0 and "not committed yet" in out and "stored offset 150" in out
    code, out, _ = explain(99)
    assert code == 0 and "before the job's start" in out and "seed" in out
    code, out, _ = run_cli(
        "offsets", "explain", "--job", run.job, "--topic", "t", "--partition", "0", "--offset", "104",
        "--format", "json", *s,
    )  # fmt: skip
    answer = json.loads(out)
    assert answer["verdict"] == "committed" and answer["commits"][0]["batch"] == 7

    # a commit pruned by retention: outside the known history, said so
    with engine.begin() as conn:
        conn.execute(
            sa.text(f'DELETE FROM "{migrated.schema}".commits WHERE job = :j AND from_off = 100'),
            {"j": run.job},
        )
    code, out, _ = explain(104)
    assert code == 0 and "outside the known history" in out

    code, _, err = explain(5, partition=9)  # a partition the job does not have: an error naming it
    assert code == 1 and "t[9]" in err
    code, _, err = run_cli("offsets", "explain", "--job", run.job, "--topic", "t", "--partition", "0", *s)
    assert code == 64 and "--offset" in err


def test_retention_deletes_old_rows_in_bounded_steps(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    for i in range(5):
        commit_ranges(store, run, [OffsetRange("t", 0, i, i + 1)])
    with engine.begin() as conn:  # three of them 40 days old
        conn.execute(
            sa.text(
                f"UPDATE \"{migrated.schema}\".commits SET committed_at = now() - interval '40 days' "
                "WHERE job = :j AND from_off < 3"
            ),
            {"j": run.job},
        )
    other = start_run(store, run.job + "-other")
    seed(engine, migrated, other.job, {("t", 0): 0})
    commit_ranges(store, other, [OffsetRange("t", 0, 0, 1)])

    db = DatabaseSettings(migrated.url, schema=migrated.schema, lineage_retention_days=30)
    with engine.begin() as conn:
        assert lineage.prune(conn, db, run.job, max_rows=2) == 2  # bounded
    with engine.begin() as conn:
        assert lineage.prune(conn, db, run.job, max_rows=2) == 1
    with engine.begin() as conn:
        assert lineage.prune(conn, db, run.job, max_rows=2) == 0
    assert [row[2] for row in commits(engine, migrated, run.job)] == [3, 4]
    assert len(commits(engine, migrated, other.job)) == 1  # another job's rows are its own

    # the planner's periodic prune: at most once per interval, unless the last one was full
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE \"{db.schema}\".commits SET committed_at = now() - interval '40 days'"))
    lineage.forget_prunes()
    with engine.begin() as conn:
        assert lineage.prune_due(conn, db, run.job, max_rows=1) == 1  # full: due again at once
    with engine.begin() as conn:
        assert lineage.prune_due(conn, db, run.job, max_rows=1) == 1
    with engine.begin() as conn:
        assert lineage.prune_due(conn, db, run.job, max_rows=1) == 0  # nothing left
    with engine.begin() as conn:
        assert lineage.prune_due(conn, db, other.job, max_rows=1) == 1  # per job
    commit_ranges(store, run, [OffsetRange("t", 0, 5, 6)])
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE \"{db.schema}\".commits SET committed_at = now() - interval '40 days'"))
        assert lineage.prune_due(conn, db, run.job) is None  # not due: pruned a moment ago


def test_retention_setting_is_checked(migrated: DatabaseSettings) -> None:
    assert DatabaseSettings(migrated.url).lineage_retention_days == 30
    for bad in (0, -1, float("nan"), float("inf"), True, "30"):
        with pytest.raises(ConfigError, match="lineage_retention_days"):
            DatabaseSettings(migrated.url, lineage_retention_days=bad)  # type: ignore[arg-type]


def test_upgrade_grants_lineage_to_the_existing_run_roles(
    admin_engine: sa.Engine, engine: sa.Engine, db: DatabaseSettings, job_name: str
) -> None:
    """A run role granted before 0008 keeps committing after the upgrade (the migration grants it
    SELECT, INSERT, DELETE on commits, and 0013 its grants on job_runs, which the trigger on jobs
    writes when it starts a run), and may not rewrite the lineage."""
    assert migrate.upgrade(db, "0007") == "0007"
    role, password = f"run_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    later = (".commits ", ".job_runs ")  # the tables of 0008 and 0013
    old_grants = [g for g in run_role_grants(db.schema, role) if not any(t in g for t in later)]
    assert len(old_grants) == len(run_role_grants(db.schema, role)) - len(later)
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))  # generated hex
        for stmt in old_grants:
            conn.execute(sa.text(stmt))
    url = db.url.set(username=role, password=password).render_as_string(hide_password=False)
    role_db = DatabaseSettings(Secret(url), schema=db.schema, lineage_retention_days=1)
    role_engine = sa.create_engine(role_db.url, poolclass=sa.pool.NullPool)
    try:
        assert migrate.upgrade(db) == migrate.head()
        run = start_run(Store(role_engine, role_db), job_name)
        with role_engine.begin() as conn:
            offset_rows.seed_offsets(conn, role_db, job_name, {("t", 0): 0}, reason="first", actor="job")
        assert commit_ranges(Store(role_engine, role_db), run, [OffsetRange("t", 0, 0, 3)])[0].outcome is (
            Outcome.COMMITTED
        )
        with engine.begin() as conn:
            conn.execute(
                sa.text(f"UPDATE \"{db.schema}\".commits SET committed_at = now() - interval '2 days'")
            )
        with role_engine.begin() as conn:
            assert lineage.prune(conn, role_db, job_name) == 1
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), role_engine.begin() as conn:
            conn.execute(sa.text(f'UPDATE "{db.schema}".commits SET until_off = 0'))
    finally:
        role_engine.dispose()
        with admin_engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))


def test_lineage_off_commits_without_rows(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    """``DatabaseSettings(lineage=False)`` (for measuring the lineage's cost in make bench): the
    same guarded claim and write, no commits row; the default records them."""
    assert DatabaseSettings(migrated.url).lineage is True
    off = DatabaseSettings(migrated.url, schema=migrated.schema, lineage=False)
    assert "lineage=False" in repr(off)
    seed(engine, migrated, run.job, {("t", 0): 0})
    out = commit_ranges(Store(engine, off), run, [OffsetRange("t", 0, 0, 4)], aggregate.write)
    assert out[0].outcome is Outcome.COMMITTED
    again = commit_ranges(Store(engine, off), run, [OffsetRange("t", 0, 0, 4)], aggregate.write)
    assert again[0].outcome is Outcome.ALREADY_COMMITTED  # still guarded
    assert commits(engine, migrated, run.job) == []
    commit_ranges(store, run, [OffsetRange("t", 0, 4, 6)], aggregate.write)
    assert [row[2:4] for row in commits(engine, migrated, run.job)] == [(4, 6)]
    assert aggregate.value() == 2
    with pytest.raises(ConfigError, match="lineage"):
        DatabaseSettings(migrated.url, lineage="no")  # type: ignore[arg-type]
