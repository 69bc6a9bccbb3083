"""Least privilege per job: `db role` + `db grants --job` give a role its own job's rows only.

Row-level security ties every row of jobs, offsets, offset_audit, job_stats, stream_plans and
dead_letters to the role that owns the job (job_owners, compared with current_user). Real
PostgreSQL, real roles logging in with their own passwords, the real CLI.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of
from tests.unproven import commit_ranges
from txn_offsets import cli
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.store import offset_rows, stats
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import end_run, start_run
from txn_offsets.store.schema import run_role_grants


@dataclass(frozen=True)
class JobRole:
    role: str
    db: DatabaseSettings
    engine: sa.Engine


RunCli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def as_url(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[[str], RunCli]:
    """as_url(url)(*argv): the CLI run with TXN_OFFSETS_DATABASE_URL = url."""

    def bind(url: str) -> RunCli:
        def run(*argv: str) -> tuple[int, str, str]:
            monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", url)
            code = cli.main(list(argv))
            out, err = capsys.readouterr()
            return code, out, err

        return run

    return bind


@pytest.fixture
def make_role(
    admin_engine: sa.Engine,
    admin_database_url: str,
    migrated: DatabaseSettings,
    as_url: Callable[[str], RunCli],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., JobRole]]:
    """make_role(job=..., tables=...): a LOGIN role made by `db role --apply`, given the job by
    `db grants --job --apply` (both run as the stack's admin), and an engine logged in as it."""
    made: list[JobRole] = []
    admin_cli = as_url(admin_database_url)

    def make(job: str | None = None, tables: tuple[str, ...] = ()) -> JobRole:
        role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
        monkeypatch.setenv("TXN_OFFSETS_ROLE_PASSWORD", password)
        code, out, err = admin_cli("db", "role", "--role", role, "--apply")
        assert code == 0, err
        assert password not in out + err
        monkeypatch.delenv("TXN_OFFSETS_ROLE_PASSWORD")
        args = ["db", "grants", "--schema", migrated.schema, "--role", role, "--apply"]
        if job is not None:
            args += ["--job", job]
        for table in tables:
            args += ["--table", table]
        code, out, err = admin_cli(*args)
        assert code == 0, err
        url = migrated.url.set(username=role, password=password)
        db = DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=migrated.schema)
        made.append(JobRole(role, db, sa.create_engine(db.url, poolclass=sa.pool.NullPool)))
        return made[-1]

    yield make
    with admin_engine.begin() as conn:
        for r in made:
            r.engine.dispose()
            conn.execute(sa.text(f"DROP OWNED BY {r.role}"))
            conn.execute(sa.text(f"DROP ROLE {r.role}"))


def _run_a_batch(r: JobRole, job: str, until: int) -> None:
    run = start_run(Store(r.engine, r.db), job)
    with r.engine.begin() as conn:
        offset_rows.seed_offsets(conn, r.db, job, {("t", 0): 0}, reason="first run", actor="job")
    store = Store(r.engine, r.db)
    assert commit_ranges(store, run, [OffsetRange("t", 0, 0, until)])[0].outcome is Outcome.COMMITTED
    assert stats.record_batch(store, job, 0.1, {"committed": 1})
    assert end_run(Store(r.engine, r.db), run)


def _count(engine: sa.Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())


def test_a_role_reaches_its_own_job_only(
    make_role: Callable[..., JobRole],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    as_url: Callable[[str], RunCli],
) -> None:
    s = migrated.schema
    job_a, job_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    a, b = make_role(job=job_a), make_role(job=job_b)
    _run_a_batch(a, job_a, 10)
    _run_a_batch(b, job_b, 20)
    assert offsets_of(engine, migrated, job_b) == {("t", 0): 20}  # the schema owner sees every job

    # A sees none of B's rows in any table, and sees its own
    for table in ("jobs", "offsets", "offset_audit", "job_stats"):
        assert _count(a.engine, f'SELECT count(*) FROM "{s}".{table} WHERE job = :j', j=job_b) == 0
        assert _count(a.engine, f'SELECT count(*) FROM "{s}".{table} WHERE job = :j', j=job_a) == 1
    for table in ("stream_plans", "dead_letters"):
        assert _count(a.engine, f'SELECT count(*) FROM "{s}".{table}') == 0
    with a.engine.connect() as conn:
        assert offset_rows.load_offsets(conn, a.db, job_b) == {}
    # ... cannot move them (zero rows), nor write rows for B (row-level security), nor read the owners
    with a.engine.begin() as conn:
        moved = conn.execute(sa.text(f'UPDATE "{s}".offsets SET off = 0 WHERE job = :j'), {"j": job_b})
        assert moved.rowcount == 0
    for forbidden, match in (
        (f"INSERT INTO \"{s}\".offsets (job, topic, part, off) VALUES ('{job_b}', 'u', 0, 0)", "row-level"),
        (
            f'INSERT INTO "{s}".offset_audit (job, topic, part, new_off, action, reason, actor) '
            f"VALUES ('{job_b}', 't', 0, 0, 'reset', 'x', 'x')",
            "row-level",
        ),
        (f"INSERT INTO \"{s}\".job_stats (job, batch_buckets) VALUES ('{job_b}', '{{}}')", "row-level"),
        (f'SELECT * FROM "{s}".job_owners', "permission denied"),
        (f"INSERT INTO \"{s}\".job_owners (job, role) VALUES ('{job_b}', '{a.role}')", "permission denied"),
    ):
        with pytest.raises(sa.exc.ProgrammingError, match=match), a.engine.begin() as conn:
            conn.execute(sa.text(forbidden))
    # ... and a run of B as A fails, naming the role, the job and the fix, before any change
    with pytest.raises(ConfigError, match=rf"role '{a.role}' may not use job '{job_b}'.*db grants --job"):
        start_run(Store(a.engine, a.db), job_b)

    # the CLI as A: `offsets show/reset --job B` fail clearly; `jobs list` lists A's job only
    a_cli = as_url(a.db.url.render_as_string(hide_password=False))
    code, out, err = a_cli("offsets", "show", "--schema", s, "--job", job_b)
    assert code != 0 and f"may not use job '{job_b}'" in err, (out, err)
    code, out, err = a_cli(
        "offsets", "reset", "--schema", s, "--job", job_b, "--to-offset", "0", "--reason", "steal", "--force"
    )
    assert code != 0 and f"may not use job '{job_b}'" in err, (out, err)
    code, out, err = a_cli("jobs", "list", "--schema", s, "--format", "json")
    assert code == 0 and job_a in out and job_b not in out, (out, err)
    code, out, err = a_cli("offsets", "show", "--schema", s, "--job", job_a)
    assert code == 0 and "10" in out, (out, err)

    assert offsets_of(engine, migrated, job_b) == {("t", 0): 20}
    assert offsets_of(engine, migrated, job_a) == {("t", 0): 10}


def test_unowned_jobs_stay_with_the_old_shared_run_role(
    make_role: Callable[..., JobRole],
    admin_engine: sa.Engine,
    engine: sa.Engine,
    migrated: DatabaseSettings,
) -> None:
    """Upgrade path: a role granted the old way (no job owned) keeps every job without an owner;
    it cannot reach an owned job, and a per-job role cannot reach an unowned one."""
    s = migrated.schema
    legacy = make_role()  # `db grants --role` without --job: the old shared run role
    job_old, job_a = f"old-{uuid.uuid4().hex[:8]}", f"a-{uuid.uuid4().hex[:8]}"
    a = make_role(job=job_a)
    _run_a_batch(legacy, job_old, 5)
    _run_a_batch(a, job_a, 7)
    assert _count(legacy.engine, f'SELECT count(*) FROM "{s}".offsets WHERE job = :j', j=job_a) == 0
    assert _count(a.engine, f'SELECT count(*) FROM "{s}".offsets WHERE job = :j', j=job_old) == 0
    with pytest.raises(ConfigError, match=f"may not use job '{job_a}'"):
        start_run(Store(legacy.engine, legacy.db), job_a)
    with pytest.raises(ConfigError, match=f"may not use job '{job_old}'"):
        start_run(Store(a.engine, a.db), job_old)
    assert offsets_of(engine, migrated, job_old) == {("t", 0): 5}
    # the grants the old way are still exactly run_role_grants
    with admin_engine.connect() as conn:
        privs = conn.execute(
            sa.text(
                "SELECT table_name, string_agg(privilege_type, ',' ORDER BY privilege_type) "
                "FROM information_schema.role_table_grants WHERE grantee = :r GROUP BY table_name"
            ),
            {"r": legacy.role},
        ).all()
    assert dict(privs) == {
        "alembic_version": "SELECT",
        "commits": "DELETE,INSERT,SELECT",
        "job_runs": "DELETE,INSERT,SELECT,UPDATE",  # the runs' trigger (migration 0013)
        "dead_letters": "INSERT,SELECT",
        "job_stats": "INSERT,SELECT,UPDATE",
        "jobs": "INSERT,SELECT,UPDATE",
        "offset_audit": "INSERT,SELECT",
        "offsets": "INSERT,SELECT,UPDATE",
        "stream_plans": "INSERT,SELECT,UPDATE",
    }
    assert len(run_role_grants(s, legacy.role)) == 9


def test_grants_print_the_owner_row_and_result_tables(
    as_url: Callable[[str], RunCli], database_url: str
) -> None:
    run = as_url(database_url)
    code, out, err = run(
        "db",
        "grants",
        "--schema",
        "s1",
        "--role",
        "job_a",
        "--job",
        "it's-a",
        "--table",
        "res.counts",
        "--table",
        "totals",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert 'GRANT USAGE ON SCHEMA "s1" TO "job_a";' in lines
    assert 'GRANT USAGE ON SCHEMA "res" TO "job_a";' in lines
    assert 'GRANT SELECT, INSERT, UPDATE ON "res"."counts" TO "job_a";' in lines
    assert 'GRANT SELECT, INSERT, UPDATE ON "totals" TO "job_a";' in lines
    assert (
        "INSERT INTO \"s1\".job_owners (job, role) VALUES ('it''s-a', 'job_a') "
        "ON CONFLICT (job) DO UPDATE SET role = EXCLUDED.role, granted_at = now();"
    ) in lines
    code, out, err = run("db", "grants", "--role", "job_a", "--table", "x.y.z")
    assert code != 0 and "--table" in err and "x.y.z" in err
    code, out, err = run("db", "role", "--role", "job_a")
    assert code == 0, err
    assert 'CREATE ROLE "job_a"' in out and "NOSUPERUSER" in out and "NOBYPASSRLS" in out
    code, out, err = run("db", "role", "--role", "Bad-Name")
    assert code != 0 and "role" in err


def test_db_role_refuses_to_strip_a_superuser(
    as_url: Callable[[str], RunCli], admin_database_url: str, admin_engine: sa.Engine
) -> None:
    with admin_engine.connect() as conn:
        me = conn.execute(sa.text("SELECT current_user")).scalar_one()
    code, out, err = as_url(admin_database_url)("db", "role", "--role", me, "--apply")
    assert code != 0 and "superuser" in err, (out, err)
    with admin_engine.connect() as conn:
        assert conn.execute(
            sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        ).scalar_one()


def test_job_run_warns_as_owner_and_refuses_a_foreign_job(
    make_role: Callable[..., JobRole],
    migrated: DatabaseSettings,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = topic_factory(partitions=1)
    kafka = KafkaSettings(kafka_bootstrap)
    job_a, job_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    spec_b = JobSpec(job=job_b, selection=TopicSelection((topic,), None))
    with caplog.at_level(logging.WARNING, logger="txn_offsets"), job_run(spec_b, migrated, kafka) as (_, run):
        assert run.job == job_b
    warned = [r.getMessage() for r in caplog.records if "row-level security" in r.getMessage()]
    assert len(warned) == 1 and "owner" in warned[0] and job_b in warned[0], warned
    caplog.clear()

    a = make_role(job=job_a)
    with job_run(JobSpec(job=job_a, selection=TopicSelection((topic,), None)), a.db, kafka):
        pass
    assert not [r for r in caplog.records if "row-level security" in r.getMessage()]
    with (
        pytest.raises(ConfigError, match=rf"role '{a.role}' may not use job '{job_b}'"),
        job_run(spec_b, a.db, kafka),
    ):
        pass
    with a.engine.connect() as conn:  # nothing of B changed: A still sees none of it
        assert conn.execute(sa.text(f'SELECT count(*) FROM "{migrated.schema}".jobs')).scalar_one() == 1
