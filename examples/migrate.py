"""Create (or upgrade) the examples' result tables: ``python -m examples.migrate``.

The examples keep their own alembic history and version table in schema ``txn_examples``, apart from
the library's offsets schema. ``python -m examples.migrate`` (and ``make demo``) run :func:`prepare`:
the offsets schema and these tables migrated as the database's owner (TXN_OFFSETS_OWNER_DATABASE_URL,
which the local stack writes; else TXN_OFFSETS_DATABASE_URL), then the role of
TXN_OFFSETS_DATABASE_URL - the stack's run role, which the example jobs run as - granted both.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from examples.schema import metadata
from txn_offsets.admin import grants
from txn_offsets.config import DatabaseSettings, database_from_env
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate as store_migrate
from txn_offsets.store.handle import Store

HERE = Path(__file__).resolve().parent


def config(db: DatabaseSettings) -> Config:
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    cfg.attributes["db"] = db
    return cfg


def upgrade(db: DatabaseSettings) -> None:
    command.upgrade(config(db), "head")


def check(db: DatabaseSettings) -> None:
    command.check(config(db))


OWNER_URL_ENV = "TXN_OFFSETS_OWNER_DATABASE_URL"


def prepare(db: DatabaseSettings) -> str | None:
    """Migrate the offsets schema and the examples' tables as the owner (:data:`OWNER_URL_ENV` when
    set, else `db`); when `db` is another role (the stack's run role), grant it the run role's
    rights and the examples' tables. Returns the role granted (None: `db` is the owner)."""
    url = os.environ.get(OWNER_URL_ENV)
    owner = DatabaseSettings(Secret(url), schema=db.schema) if url else db
    store_migrate.upgrade(owner)
    upgrade(owner)
    role = db.url.username
    if role is None or role == owner.url.username:
        return None
    store = Store.of(owner)
    try:
        grants.apply_grants(store, role, tables=[table.fullname for table in metadata.sorted_tables])
    finally:
        store.engine.dispose()
    return role


if __name__ == "__main__":
    settings = database_from_env()
    granted = prepare(settings)
    print(
        f"examples: result tables migrated in {settings.display_url}"
        + (f"; role {granted!r} granted them" if granted else "")
    )
    sys.exit(0)
