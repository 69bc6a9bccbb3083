"""The documented grants are enough for a job's run role, and that role cannot do DDL or DELETE."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store import offset_rows, stats
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import end_run, heartbeat, start_run
from txn_offsets.store.schema import run_role_grants


@pytest.fixture
def run_role_db(admin_engine: sa.Engine, migrated: DatabaseSettings) -> Iterator[DatabaseSettings]:
    role, password = f"run_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    with admin_engine.begin() as conn:
        # CREATE ROLE takes no bind parameters; both values are generated hex above
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        for stmt in run_role_grants(migrated.schema, role):
            conn.execute(sa.text(stmt))
    url = migrated.url.set(username=role, password=password)
    yield DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=migrated.schema)
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))


def test_run_role_runs_a_job_but_cannot_delete_or_alter(
    run_role_db: DatabaseSettings, engine: sa.Engine, job_name: str
) -> None:
    db = run_role_db
    role_engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        run = start_run(Store(role_engine, db), job_name)
        with role_engine.begin() as conn:
            offset_rows.seed_offsets(conn, db, job_name, {("t", 0): 0}, reason="first run", actor="job")
        out = commit_ranges(Store(role_engine, db), run, [OffsetRange("t", 0, 0, 10)])
        assert out[0].outcome is Outcome.COMMITTED
        heartbeat(Store(role_engine, db), run)
        with role_engine.begin() as conn:
            assert offset_rows.skip_lost(conn, db, job_name, "t", 0, 10, 20, "retention", actor="job")
        assert end_run(Store(role_engine, db), run)
        assert offsets_of(engine, db, job_name) == {("t", 0): 20}
        # the runner's batch statistics (job_stats) work with the same grants
        assert stats.record_batch(Store(role_engine, db), job_name, 0.5, {"committed": 1})
        assert stats.record_failure(Store(role_engine, db), job_name, "fenced")

        for forbidden in (
            f'DELETE FROM "{db.schema}".offsets',
            f'DELETE FROM "{db.schema}".offset_audit',
            f'DELETE FROM "{db.schema}".job_stats',
            f'UPDATE "{db.schema}".offset_audit SET actor = reason',
            f'ALTER TABLE "{db.schema}".offsets ADD COLUMN x int',
            f'CREATE TABLE "{db.schema}".x (i int)',
            f'DROP TABLE "{db.schema}".jobs',
        ):
            with (
                pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"),
                role_engine.begin() as conn,
            ):
                conn.execute(sa.text(forbidden))
        assert offsets_of(engine, db, job_name) == {("t", 0): 20}
    finally:
        role_engine.dispose()
