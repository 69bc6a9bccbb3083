"""Migrations: from empty to head, down to base, up again; no drift between models and migrations."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli
from txn_offsets import MigrationError, SchemaMissing
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
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
        "job_stats",
        "stream_plans",
        "job_owners",
        "commits",
        "job_runs",
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
        "job_stats",
        "stream_plans",
        "job_owners",
        "commits",
        "job_runs",
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


def test_alembic_command_line_uses_alembic_ini(database_url: str, db: DatabaseSettings) -> None:
    """`alembic` by hand, from the repository root, finds alembic.ini and the schema via -x."""
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    alembic = [sys.executable, "-m", "alembic", "-x", f"schema={db.schema}"]
    root = MIGRATIONS_DIR.parent  # the repository root: migrations/ beside alembic.ini
    for args in (["upgrade", "head"], ["check"]):
        done = subprocess.run(
            [*alembic, *args], cwd=root, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    assert migrate.current(db) == migrate.head()


def test_check_when_the_schema_is_on_the_search_path(db: DatabaseSettings) -> None:
    """A search_path naming the schema (the URL's options) makes it the session's default schema:
    `db check` must still compare it table by table, not report every table missing."""
    url = db.url.update_query_dict({"options": f"-c search_path={db.schema},public"})
    on_path = DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=db.schema)
    assert migrate.upgrade(on_path) == migrate.head()
    migrate.check(on_path)
    migrate.check(db)


@pytest.fixture
def role_named_like_schema(admin_engine: sa.Engine, db: DatabaseSettings) -> Iterator[DatabaseSettings]:
    """A login role with the schema's name: PostgreSQL's default search_path ("$user", public) puts
    the schema first, exactly like the local stack's role `txn_offsets` and its schema."""
    role, password = db.schema, uuid.uuid4().hex
    with admin_engine.begin() as conn:
        database = conn.execute(sa.text("SELECT current_database()")).scalar_one()
        # CREATE ROLE / GRANT take no bind parameters: the role is a validated identifier, the
        # password generated hex, the database name quoted
        conn.execute(sa.text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"))
        conn.execute(sa.text(f'GRANT CREATE ON DATABASE "{database}" TO "{role}"'))
    url = db.url.set(username=role, password=password)
    yield DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=db.schema)
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{role}" CASCADE'))
        conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
        conn.execute(sa.text(f'DROP ROLE "{role}"'))


def test_check_for_a_role_named_like_the_schema(role_named_like_schema: DatabaseSettings) -> None:
    db = role_named_like_schema
    assert migrate.upgrade(db) == migrate.head()
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:  # the premise: the schema is the session's default
            assert conn.execute(sa.text("SELECT current_schema()")).scalar_one() == db.schema
    finally:
        engine.dispose()
    migrate.check(db)
    assert migrate.current(db) == migrate.head()


def test_check_names_each_difference_on_one_line(engine: sa.Engine, migrated: DatabaseSettings) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{migrated.schema}".dead_letters'))
        conn.execute(sa.text(f'ALTER TABLE "{migrated.schema}".jobs ADD COLUMN extra int'))
    with pytest.raises(MigrationError) as info:
        migrate.check(migrated)
    message = str(info.value)
    assert "add_table dead_letters" in message and "remove_column jobs.extra" in message
    assert "\n" not in message and "Column(" not in message


def test_db_commands_are_quiet_unless_verbose(database_url: str, db: DatabaseSettings) -> None:
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    env.pop("TXN_OFFSETS_LOG_FORMAT", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli"]
    quiet = subprocess.run(
        [*cmd, "db", "upgrade", "--schema", db.schema], env=env, capture_output=True, text=True, check=True
    )
    assert quiet.stdout == f"schema {db.schema!r} is at revision {migrate.head()}\n"
    assert quiet.stderr == ""
    checked = subprocess.run(
        [*cmd, "db", "check", "--schema", db.schema], env=env, capture_output=True, text=True, check=True
    )
    assert checked.stderr == ""
    verbose = subprocess.run(
        [*cmd, "-v", "db", "check", "--schema", db.schema],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "alembic" in verbose.stderr


def _word_counts_in(engine: sa.Engine, schema: str) -> None:
    """The README's `word_counts`, created unqualified by a role whose search_path starts with the
    store's schema (the local stack's `txn_offsets`): it lands in that schema, beside the store."""
    word_counts = sa.Table(
        "word_counts",
        sa.MetaData(),
        sa.Column("word", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger),
    )
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT set_config('search_path', :path, true)"), {"path": f'"{schema}"'})
        word_counts.create(conn)
        conn.execute(sa.text("CREATE INDEX word_counts_n ON word_counts (n)"))
        assert sa.inspect(conn).has_table("word_counts", schema=schema)  # the premise


def test_check_passes_with_user_tables_in_the_store_schema(
    engine: sa.Engine, migrated: DatabaseSettings, run_cli: Cli
) -> None:
    """`db check` judges only the store's own tables: a deploy that gates on it must not stop
    because a job's result tables share the schema."""
    _word_counts_in(engine, migrated.schema)
    migrate.check(migrated)
    code, out, err = run_cli("db", "check", "--schema", migrated.schema)
    assert (code, err) == (0, ""), err
    assert out == f"schema {migrated.schema!r} is at head and matches the models\n"


def test_check_still_reports_drift_of_the_store_beside_user_tables(
    engine: sa.Engine, migrated: DatabaseSettings
) -> None:
    _word_counts_in(engine, migrated.schema)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{migrated.schema}".dead_letters'))
        conn.execute(sa.text(f'ALTER TABLE "{migrated.schema}".jobs DROP COLUMN retired_at'))
        conn.execute(sa.text(f'CREATE INDEX offsets_extra ON "{migrated.schema}".offsets (updated_at)'))
    with pytest.raises(MigrationError) as info:
        migrate.check(migrated)
    message = str(info.value)
    for diff in ("add_table dead_letters", "add_column jobs.retired_at", "remove_index offsets_extra"):
        assert diff in message, message
    assert "word_counts" not in message
