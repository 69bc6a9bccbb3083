"""Per-job roles on Spark: job A runs exact as its own role (row-level security on every table it
touches, INSERT/UPDATE on its result table only); a run of job B as A's role fails clearly and
changes nothing of B."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from txn_offsets.admin.grants import apply_grants, apply_role
from txn_offsets.config import DatabaseSettings, KafkaSettings, Secret
from txn_offsets.errors import ConfigError


@pytest.fixture
def job_role(admin_database_url: str, db: DatabaseSettings) -> Iterator[Callable[..., DatabaseSettings]]:
    """job_role(job, tables): settings logged in as a new role that owns `job` (made as the admin)."""
    admin_db = DatabaseSettings(Secret(admin_database_url), schema=db.schema)
    admin = sa.create_engine(admin_database_url, poolclass=sa.pool.NullPool)
    roles: list[str] = []

    def make(job: str, tables: tuple[str, ...] = ()) -> DatabaseSettings:
        role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
        assert apply_role(admin, admin_db, role, Secret(password))
        apply_grants(admin, admin_db, role, job=job, tables=tables)
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
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_role: Callable[..., DatabaseSettings],
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=4)
    expected = produce(topic, 4_000, 4)
    job_a, job_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    table = counts_table.replace('"', "")  # schema.counts
    role_a = job_role(job_a, (table,))
    role_b = job_role(job_b, (table,))

    def run(job: str, as_db: DatabaseSettings) -> Any:
        return run_test_job(counting_writer(counts_table), [topic], job=job, database=as_db)

    summary = run(job_a, role_a)
    assert summary.records == 4_000
    assert totals(engine, counts_table) == dict(expected)
    assert stored_offsets(engine, db, job_a) == {(topic, p): 1_000 for p in range(4)}

    # B has its own role; A's role may not run B: refused before anything changes
    with pytest.raises(ConfigError, match=rf"role '{role_a.url.username}' may not use job '{job_b}'"):
        run(job_b, role_a)
    assert stored_offsets(engine, db, job_b) == {}
    with engine.connect() as conn:
        jobs = conn.execute(sa.text(f'SELECT job FROM "{db.schema}".jobs ORDER BY job')).scalars().all()
    assert jobs == [job_a]
    assert totals(engine, counts_table) == dict(expected)  # nothing counted twice
    assert role_b.url.username != role_a.url.username
