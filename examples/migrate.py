"""Create (or upgrade) the examples' result tables: ``python -m examples.migrate``.

Uses TXN_OFFSETS_DATABASE_URL; the examples keep their own alembic history and version table in
schema ``txn_examples``, apart from the library's offsets schema.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from txn_offsets.config import DatabaseSettings, database_from_env

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


if __name__ == "__main__":
    settings = database_from_env()
    upgrade(settings)
    print(f"examples: result tables migrated in {settings.display_url}")
    sys.exit(0)
