"""`txn-offsets db upgrade/current/check` through PgBouncer in transaction mode.

The migrations run with ``search_path = pg_catalog`` (migrations/env.py) so that a
schema which is the session's default (a role named like the schema meets ``"$user"`` first, or a
role's own ``search_path``) is still compared table by table. On a direct connection that setting
travels in libpq's ``options``; PgBouncer drops ``options``, so behind it the search_path must be
set inside the migration's transaction.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fix_services import Services, started_pgbouncer
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate


@pytest.fixture
def role_named_like_schema(services: Services, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A login role with the schema's name (its default search_path finds the schema first) and a
    PgBouncer of this test that knows it; yields (the role's URL through PgBouncer, its direct URL,
    the schema)."""
    role, password = f"r_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    admin = sa.create_engine(services.admin_database_url, poolclass=sa.NullPool)
    with admin.begin() as conn:
        database = conn.execute(sa.text("SELECT current_database()")).scalar_one()
        # CREATE ROLE / GRANT take no bind parameters: the role is generated, the password hex
        conn.execute(sa.text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"))
        conn.execute(sa.text(f'GRANT CREATE ON DATABASE "{database}" TO "{role}"'))
    direct = sa.engine.make_url(services.database_url).set(username=role, password=password)
    try:
        with started_pgbouncer(services, tmp_path / "pgbouncer", extra_roles=[role]) as app_url:
            pooled = sa.engine.make_url(app_url).set(username=role, password=password)
            yield (pooled.render_as_string(False), direct.render_as_string(False), role)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{role}" CASCADE'))
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()


def _db(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", "db", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_db_upgrade_current_check_through_pgbouncer(role_named_like_schema: tuple[str, str, str]) -> None:
    pooled_url, direct_url, schema = role_named_like_schema
    engine = sa.create_engine(pooled_url, poolclass=sa.NullPool, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as conn:  # the premise: behind PgBouncer the schema is the default one
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
            conn.commit()
            assert conn.execute(sa.text("SELECT current_schema()")).scalar_one() == schema
    finally:
        engine.dispose()
    head = migrate.head()
    password = sa.engine.make_url(pooled_url).password
    outputs = []
    for args, expected in (
        (("upgrade",), f"schema {schema!r} is at revision {head}"),
        (("current",), f"schema {schema!r}: revision {head} (head)"),
        (("check",), f"schema {schema!r} is at head and matches the models"),
        (("upgrade",), f"schema {schema!r} is at revision {head}"),  # at head: a no-op
    ):
        done = _db(pooled_url, *args, "--schema", schema)
        outputs.append(done.stdout + done.stderr)
        assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr
    assert str(password) not in "".join(outputs)
    # the same schema, checked over a direct connection (the options' search_path) and in-process
    migrate.check(DatabaseSettings(Secret(direct_url), schema=schema))
    assert migrate.current(DatabaseSettings(Secret(pooled_url), schema=schema)) == head
