"""Per-job roles on Spark: job A runs exact as its own role (row-level security on every table it
touches, INSERT/UPDATE on its result table only); a run of job B as A's role fails clearly and
changes nothing of B."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import Counting
from txn_offsets.admin.grants import apply_grants, apply_role
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret
from txn_offsets.store.handle import Store


@pytest.fixture
def job_role(admin_database_url: str, db: DatabaseSettings) -> Iterator[Callable[..., DatabaseSettings]]:
    """job_role(job, tables): settings logged in as a new role that owns `job` (made as the admin)."""
    admin_db = DatabaseSettings(Secret(admin_database_url), schema=db.schema)
    admin = sa.create_engine(admin_database_url, poolclass=sa.pool.NullPool)
    roles: list[str] = []

    def make(job: str, tables: tuple[str, ...] = ()) -> DatabaseSettings:
        role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
        assert apply_role(Store(admin, admin_db), role, Secret(password))
        apply_grants(Store(admin, admin_db), role, job=job, tables=tables)
        roles.append(role)
        url = db.url.set(username=role, password=password).render_as_string(hide_password=False)
        return DatabaseSettings(Secret(url), schema=db.schema)

    yield make
    with admin.begin() as conn:
        for role in roles:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
    admin.dispose()


def test_job_runs_exact_as_its_role_and_not_as_another_jobs(
    counting: Counting, job_role: Callable[..., DatabaseSettings]
) -> None:
    topic, expected = counting.topic(4, 4_000)
    job_a, job_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    table = counting.table.replace('"', "")  # schema.counts
    role_a = job_role(job_a, (table,))
    role_b = job_role(job_b, (table,))

    def run(job: str, as_db: DatabaseSettings) -> Any:
        return counting.run(topic, job=job, database=as_db)

    summary = run(job_a, role_a)
    assert summary.records == 4_000
    assert counting.totals() == dict(expected)
    assert counting.offsets(job_a) == {(topic, p): 1_000 for p in range(4)}

    # B has its own role; A's role may not run B: refused before anything changes
    with pytest.raises(ConfigError, match=rf"role '{role_a.url.username}' may not use job '{job_b}'"):
        run(job_b, role_a)
    assert counting.offsets(job_b) == {}
    with counting.engine.connect() as conn:
        jobs = (
            conn.execute(sa.text(f'SELECT job FROM "{counting.db.schema}".jobs ORDER BY job')).scalars().all()
        )
    assert jobs == [job_a]
    assert counting.totals() == dict(expected)  # nothing counted twice
    assert role_b.url.username != role_a.url.username
