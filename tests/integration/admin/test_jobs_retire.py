"""`txn-offsets jobs retire`: audited, refuses a live run unless --force (which fences it), keeps
the rows by default (the job is hidden from `jobs list` unless --all) or deletes them with
--drop-rows; a new run of the job brings it back."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Fenced
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import stats
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import heartbeat, lock_job, start_run
from txn_offsets.store.schema import tables_for


def _jobs(run_cli: Cli, db: DatabaseSettings, *extra: str) -> dict[str, dict[str, object]]:
    code, out, err = run_cli("jobs", "list", "--format", "json", "--schema", db.schema, *extra)
    assert code == 0, err
    return {j["job"]: j for j in json.loads(out)}


def _count(engine: sa.Engine, table: sa.Table, job: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(table.c.job == job)).scalar_one())


def test_retire_keeps_rows_hides_the_job_and_a_new_run_brings_it_back(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    s = ["--schema", migrated.schema]
    live = start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t", 0): 4, ("t", 1): 7})
    retire = ["jobs", "retire", "--job", job_name, *s]

    code, _, err = run_cli(*retire)
    assert code == 64 and "--reason" in err and err.count("\n") == 1  # a missing argument
    code, _, err = run_cli(*retire, "--reason", "demo over")
    assert code == 1 and live.run_id in err and "--force" in err and err.count("\n") == 1
    assert job_name in _jobs(run_cli, migrated)  # refused: nothing changed

    code, out, err = run_cli(*retire, "--reason", "demo over", "--force")
    assert code == 0, err
    assert f"retired job {job_name!r}" in out and "2 partition(s)" in out and "kept" in out
    with pytest.raises(Fenced):  # the live run was fenced
        heartbeat(Store(engine, migrated), live)
    assert offsets_of(engine, migrated, job_name) == {("t", 0): 4, ("t", 1): 7}
    assert job_name not in _jobs(run_cli, migrated)
    shown = _jobs(run_cli, migrated, "--all")[job_name]
    assert shown["state"] == "retired" and shown["retired_at"] is not None and shown["live"] is False
    code, out, _ = run_cli("jobs", "list", "--all", *s)
    assert code == 0 and "retired" in out

    code, out, _ = run_cli("offsets", "history", "--job", job_name, "--format", "json", *s)
    retired = [r for r in json.loads(out) if r["action"] == "retire"]
    assert sorted((r["topic"], r["partition"], r["old"], r["new"], r["reason"]) for r in retired) == [
        ("t", 0, 4, 4, "demo over"),
        ("t", 1, 7, 7, "demo over"),
    ]
    assert {r["generation"] for r in retired} == {live.generation + 1}

    code, _, err = run_cli(*retire, "--reason", "again")
    assert code == 1 and "already retired" in err

    again = start_run(Store(engine, migrated), job_name)  # a new run: the job is back, from its offsets
    assert again.generation == live.generation + 2
    assert _jobs(run_cli, migrated)[job_name]["state"] == "live"


def test_retire_drop_rows(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, store: Store, job_name: str
) -> None:
    s = ["--schema", migrated.schema]
    t = tables_for(migrated.schema)
    run = start_run(store, job_name)
    seed(engine, migrated, job_name, {("t", 0): 0})
    assert commit_ranges(store, run, [OffsetRange("t", 0, 0, 3)])[0].outcome is Outcome.COMMITTED
    with engine.begin() as conn:  # the job has planned: a later run would not apply its start policy
        conn.execute(sa.update(t.jobs).where(t.jobs.c.job == job_name).values(first_plan_at=sa.func.now()))
    assert stats.record_batch(store, job_name, 0.5, {"committed": 1})
    with engine.begin() as conn:
        conn.execute(
            sa.insert(t.dead_letters).values(job=job_name, topic="t", part=0, off=1, value=b"x", error="bad")
        )
    run_cli("jobs", "retire", "--job", job_name, "--reason", "x", "--force", *s)  # keep first
    assert _count(engine, t.commits, job_name) == 1  # the lineage kept with the offsets
    code, out, err = run_cli("jobs", "retire", "--job", job_name, "--reason", "gone", "--drop-rows", *s)
    assert code == 0, err
    assert "deleted" in out and "1 dead letter(s) kept" in out
    for table in (t.offsets, t.stats, t.stream_plans, t.commits):
        assert _count(engine, table, job_name) == 0, table.name
    assert _count(engine, t.dead_letters, job_name) == 1
    assert _count(engine, t.audit, job_name) == 3  # seed, retire, retire (drop)
    with engine.connect() as conn:
        state = lock_job(conn, migrated, job_name, for_update=False)
    # the job row stays as the fencing generation's keeper: a new run never reuses a generation
    assert state.generation == run.generation + 2 and state.first_plan_at is None
    code, out, _ = run_cli("offsets", "show", "--job", job_name, *s)
    assert code == 0 and job_name not in out
