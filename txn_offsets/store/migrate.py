"""Schema migrations as plain functions (alembic underneath): upgrade, downgrade, current, check.

The migrations live in ``migrations/`` next to the package. The Postgres schema they work on
comes from :class:`DatabaseSettings` and travels to ``migrations/env.py`` through
``Config.attributes``, so one set of revisions serves any schema name. alembic's version table
lives inside that schema, and ``upgrade`` creates the schema when it is missing.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.pool import NullPool

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import MigrationError
from txn_offsets.store.database import engine_for, translate_errors

__all__ = ["MIGRATIONS_DIR", "alembic_config", "check", "current", "downgrade", "head", "upgrade"]

logger = logging.getLogger(__name__)


def _find_migrations() -> Path:
    """The repository's migrations/ (source tree, editable install), else the copy a wheel
    installs under <prefix>/share/txn-offsets/migrations (pyproject data-files)."""
    source = Path(__file__).resolve().parents[2] / "migrations"
    installed = Path(sys.prefix) / "share" / "txn-offsets" / "migrations"
    return source if (source / "env.py").is_file() or not (installed / "env.py").is_file() else installed


MIGRATIONS_DIR = _find_migrations()

# Keys of Config.attributes read by migrations/env.py
ATTR_DB = "txn_offsets.db"
ATTR_CREATE_SCHEMA = "txn_offsets.create_schema"

# alembic's `context` and `op` are process-wide proxies: two migrations in threads of one process
# would trample each other. Processes are serialised by an advisory lock in migrations/env.py.
_ALEMBIC_LOCK = threading.Lock()


def alembic_config(db: DatabaseSettings, *, create_schema: bool = False) -> Config:
    """An alembic Config that targets `db` (its URL never goes into the config's options)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise MigrationError("setup", db.schema, f"migrations not found at {MIGRATIONS_DIR}")
    # alembic prints progress to stdout; the CLI prints its own summary instead
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes[ATTR_DB] = db
    cfg.attributes[ATTR_CREATE_SCHEMA] = create_schema
    return cfg


def head() -> str:
    """The newest revision of the migrations."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    rev = script.get_current_head()
    if rev is None:  # pragma: no cover - the repository always ships revisions
        raise MigrationError("head", "-", "no migration revisions found")
    return rev


def _run(
    action: str,
    db: DatabaseSettings,
    fn: Callable[..., None],
    *args: str,
    create_schema: bool = False,
) -> None:
    cfg = alembic_config(db, create_schema=create_schema)
    try:
        with _ALEMBIC_LOCK, translate_errors(db):
            fn(cfg, *args)
    except CommandError as exc:
        raise MigrationError(action, db.schema, str(exc)) from None


def upgrade(db: DatabaseSettings, revision: str = "head") -> str | None:
    """Migrate up to `revision` (creating the schema if needed); returns the revision now current."""
    _run("upgrade", db, command.upgrade, revision, create_schema=True)
    now = current(db)
    logger.info("schema %r upgraded to %r", db.schema, now)
    return now


def downgrade(db: DatabaseSettings, revision: str) -> str | None:
    """Migrate down to `revision` (``base`` drops every table); returns the revision now current."""
    _run("downgrade", db, command.downgrade, revision)
    now = current(db)
    logger.info("schema %r downgraded to %r", db.schema, now)
    return now


def current(db: DatabaseSettings) -> str | None:
    """The revision the database is at, None if the tables were never created."""
    engine = engine_for(db, poolclass=NullPool)
    try:
        with translate_errors(db), engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table_schema": db.schema})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def check(db: DatabaseSettings) -> None:
    """Raise MigrationError unless the database is at head and matches the models exactly."""
    _run("check", db, command.check)
