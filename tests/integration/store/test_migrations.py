"""Migrations: from empty to head, down to base, up again; no drift between models and migrations."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from txn_offsets import MigrationError, SchemaMissing
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import migrate
from txn_offsets.store.migrate import MIGRATIONS_DIR


def _tables(engine: sa.Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names(schema=schema))


def test_upgrade_downgrade_upgrade(engine: sa.Engine, db: DatabaseSettings) -> None:
    assert migrate.current(db) is None  # schema does not even exist yet
    assert migrate.upgrade(db) == migrate.head()
    assert _tables(engine, db.schema) == {
        "jobs",
        "offsets",
        "offset_audit",
        "dead_letters",
        "alembic_version",
    }
    migrate.check(db)

    assert migrate.downgrade(db, "base") is None
    # the version table stays (alembic keeps it), every table of ours is gone
    assert _tables(engine, db.schema) == {"alembic_version"}

    assert migrate.upgrade(db) == migrate.head()
    assert _tables(engine, db.schema) == {
        "jobs",
        "offsets",
        "offset_audit",
        "dead_letters",
        "alembic_version",
    }
    migrate.check(db)
    # upgrading at head is a no-op
    assert migrate.upgrade(db) == migrate.head()


def test_check_reports_drift(engine: sa.Engine, migrated: DatabaseSettings) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f'ALTER TABLE "{migrated.schema}".offsets ADD COLUMN surprise int'))
    with pytest.raises(MigrationError, match="surprise") as info:
        migrate.check(migrated)
    assert info.value.action == "check"


def test_check_before_any_upgrade_is_a_clear_error(engine: sa.Engine, db: DatabaseSettings) -> None:
    with pytest.raises(SchemaMissing, match="txn-offsets db upgrade"):
        migrate.check(db)  # the schema does not exist
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(db.schema))
    with pytest.raises(MigrationError, match="not up to date"):
        migrate.check(db)  # the schema exists but is empty


def test_bad_revision_is_a_clear_error(migrated: DatabaseSettings) -> None:
    with pytest.raises(MigrationError, match="nope"):
        migrate.downgrade(migrated, "nope")
    assert migrate.current(migrated) == migrate.head()


def test_concurrent_upgrades_serialise(engine: sa.Engine, database_url: str, db: DatabaseSettings) -> None:
    """Deploys migrating at the same time (processes, and threads of one process) all succeed."""
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    cmd = [sys.executable, "-m", "txn_offsets.cli", "db", "upgrade", "--schema", db.schema]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors: list[BaseException] = []

    def up() -> None:
        try:
            migrate.upgrade(db)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=up) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert errors == []
    assert migrate.current(db) == migrate.head()
    assert "offsets" in _tables(engine, db.schema)


def test_alembic_command_line_uses_pyproject(database_url: str, db: DatabaseSettings) -> None:
    """`alembic` by hand, from the repository root, finds [tool.alembic] and the schema via -x."""
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    alembic = [sys.executable, "-m", "alembic", "-x", f"schema={db.schema}"]
    root = MIGRATIONS_DIR.parent
    for args in (["upgrade", "head"], ["check"]):
        done = subprocess.run(
            [*alembic, *args], cwd=root, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    assert migrate.current(db) == migrate.head()
