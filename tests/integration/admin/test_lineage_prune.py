"""``txn-offsets offsets prune``: the lineage of a job (or of every retired job) pruned by count or
by age, audited (one ``lineage_prune`` row per partition: the offsets whose commits are gone),
validated (usage errors exit 64, an unknown job 1), nothing else touched."""

from __future__ import annotations

import json

import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


def _commits(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[str, int, int]]:
    with engine.connect() as conn:
        q = f'SELECT topic, part, from_off FROM "{db.schema}".commits WHERE job = :j ORDER BY 1, 2, 3'
        return [(r.topic, r.part, r.from_off) for r in conn.execute(sa.text(q), {"j": job})]


def _age(engine: sa.Engine, db: DatabaseSettings, job: str, days: int, below: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f'UPDATE "{db.schema}".commits SET committed_at = now() - make_interval(days => :d) '
                "WHERE job = :j AND from_off < :b"
            ),
            {"d": days, "j": job, "b": below},
        )


def _committed(engine: sa.Engine, db: DatabaseSettings, run: Run, n: int) -> None:
    seed(engine, db, run.job, {("t", 0): 0, ("t", 1): 0})
    for i in range(n):
        commit_ranges(Store(engine, db), run, [OffsetRange("t", 0, i, i + 1), OffsetRange("t", 1, i, i + 1)])


def test_prune_by_count_and_by_age_audited(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    s = ["--schema", migrated.schema]
    _committed(engine, migrated, run, 5)
    other = start_run(Store(engine, migrated), run.job + "-other")
    _committed(engine, migrated, other, 2)
    prune = ["offsets", "prune", "--job", run.job, *s]

    code, out, err = run_cli(*prune, "--keep", "2", "--reason", "keep it short")
    assert code == 0, err
    assert f"pruned 6 commits row(s) of job {run.job!r}" in out and "2 partition(s)" in out
    assert _commits(engine, migrated, run.job) == [("t", 0, 3), ("t", 0, 4), ("t", 1, 3), ("t", 1, 4)]
    assert len(_commits(engine, migrated, other.job)) == 4  # another job's lineage is its own
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5, ("t", 1): 5}  # offsets untouched

    code, out, _ = run_cli("offsets", "history", "--job", run.job, "--format", "json", *s)
    audited = sorted(
        (r["topic"], r["partition"], r["old"], r["new"], r["reason"])
        for r in json.loads(out)
        if r["action"] == "lineage_prune"
    )
    assert audited == [("t", 0, 0, 3, "keep it short"), ("t", 1, 0, 3, "keep it short")]
    # explain says where the pruned lineage went instead of calling the offset skipped
    argv = ["offsets", "explain", "--job", run.job, "--topic", "t", "--partition", "0", "--offset", "1", *s]
    code, out, _ = run_cli(*argv)
    assert code == 0 and "outside the known history" in out and "pruned" in out and "keep it short" in out
    assert "skipped" not in out

    _age(engine, migrated, run.job, 10, below=4)  # (t, *, 3) are 10 days old now
    code, out, err = run_cli(*prune, "--older-than", "7d", "--reason", "a week is enough", "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [{"job": run.job, "deleted": 2, "partitions": 2}]
    assert _commits(engine, migrated, run.job) == [("t", 0, 4), ("t", 1, 4)]
    code, out, err = run_cli(*prune, "--reason", "retention")  # the default: the retention (30 days)
    assert code == 0 and "pruned 0 commits row(s)" in out, err
    code, out, _ = run_cli("offsets", "history", "--job", run.job, "--format", "json", *s)
    assert sum(r["action"] == "lineage_prune" for r in json.loads(out)) == 4  # nothing pruned: no row


def test_prune_of_retired_jobs(run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, run: Run) -> None:
    s = ["--schema", migrated.schema]
    _committed(engine, migrated, run, 3)
    live = start_run(Store(engine, migrated), run.job + "-live")
    _committed(engine, migrated, live, 3)
    for job in (run.job, live.job):
        _age(engine, migrated, job, 40, below=2)
    code, _, err = run_cli("jobs", "retire", "--job", run.job, "--reason", "done", "--force", *s)
    assert code == 0, err
    code, out, err = run_cli("offsets", "prune", "--retired", "--reason", "retention", *s)
    assert code == 0, err
    assert f"pruned 4 commits row(s) of job {run.job!r}" in out and live.job not in out
    assert _commits(engine, migrated, run.job) == [("t", 0, 2), ("t", 1, 2)]
    assert len(_commits(engine, migrated, live.job)) == 6  # not retired: its runs prune it


def test_prune_refuses_bad_input(run_cli: Cli, migrated: DatabaseSettings, run: Run, job_name: str) -> None:
    s = ["--schema", migrated.schema]
    usage = [
        ["--job", run.job, "--keep", "0"],
        ["--job", run.job, "--keep", "-3"],
        ["--job", run.job, "--keep", "x"],
        ["--job", run.job, "--older-than", "7"],
        ["--job", run.job, "--older-than", "-1d"],
        ["--job", run.job, "--older-than", "0d"],
        ["--job", run.job, "--older-than", "soon"],
        ["--job", run.job, "--older-than", "1e300d"],
        ["--job", run.job, "--keep", "2", "--older-than", "1d"],
        ["--keep", "2"],
        ["--job", run.job, "--retired"],
    ]
    for extra in usage:
        code, _, err = run_cli("offsets", "prune", *extra, "--reason", "r", *s)
        assert code == 64 and err.count("\n") == 1, (extra, code, err)
    code, _, err = run_cli("offsets", "prune", "--job", run.job, "--keep", "2", *s)
    assert code == 64 and "--reason" in err and err.count("\n") == 1  # a missing argument
    code, _, err = run_cli(
        "offsets", "prune", "--job", job_name + "-nope", "--keep", "2", "--reason", "r", *s
    )
    assert code == 1 and "unknown job" in err.lower() and err.count("\n") == 1, err
