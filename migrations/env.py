"""alembic environment for the txn_offsets tables.

Settings come from ``Config.attributes`` when called through :mod:`txn_offsets.store.migrate` (the
``txn-offsets db`` commands), else from the environment (``alembic`` run by hand): the URL only
from TXN_OFFSETS_DATABASE_URL, the schema from ``-x schema=NAME`` or TXN_OFFSETS_SCHEMA.
Online mode only: the tables live in a schema chosen at run time and the version table with them.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import context
from sqlalchemy.pool import NullPool

from txn_offsets.config import DatabaseSettings, database_from_env
from txn_offsets.errors import MigrationError
from txn_offsets.store.database import engine_for
from txn_offsets.store.migrate import ATTR_CREATE_SCHEMA, ATTR_DB
from txn_offsets.store.schema import metadata_for

logger = logging.getLogger("txn_offsets.migrations")


def _settings() -> tuple[DatabaseSettings, bool]:
    config = context.config
    db = config.attributes.get(ATTR_DB)
    if isinstance(db, DatabaseSettings):
        return db, bool(config.attributes.get(ATTR_CREATE_SCHEMA, False))
    schema = context.get_x_argument(as_dictionary=True).get("schema")
    # by hand: `alembic upgrade` should work on an empty database, so create the schema
    return database_from_env(schema=schema), True


def run_migrations_online() -> None:
    db, create_schema = _settings()
    schema = db.schema

    target = metadata_for(schema)
    ours = {table.name for table in target.tables.values()}

    def include_name(name: str | None, type_: str, parent_names: object) -> bool:
        # compare only the store's own objects: other schemas of the database belong to other
        # applications, and other tables in our schema (with their indexes and constraints) to the
        # jobs: a result table created unqualified by a role whose search_path starts with the
        # schema (the local stack's `txn_offsets`, meeting "$user" first) lands beside the store.
        # The store's tables are still compared whole, missing ones included (the models are not
        # filtered by this hook, only what is reflected from the database).
        if type_ == "schema":
            return name == schema
        if type_ == "table":
            return name in ours
        return True

    # The migration transaction sees only pg_catalog on its search_path. Otherwise, when our schema
    # is the session's default (a role named like the schema meets "$user" first, or a search_path
    # naming it), SQLAlchemy reflects its tables as "the default schema" (schema None) while the
    # models name the schema: autogenerate would report every table missing, and PostgreSQL would
    # print foreign keys to it unqualified. Every migration names the schema explicitly, so nothing
    # needs the search_path. It is set inside the transaction (SET LOCAL), not in libpq's
    # ``options``: PgBouncer drops ``options``, and a session SET would outlive the transaction on
    # a pooled server connection; the dialect's default schema, read when the engine first
    # connected, is corrected to match (this engine is the migration's own).
    engine = engine_for(db, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target,
                version_table_schema=schema,
                include_schemas=True,
                include_name=include_name,
                compare_type=True,
            )
            with context.begin_transaction():
                connection.execute(sa.text("SELECT set_config('search_path', 'pg_catalog', true)"))
                connection.dialect.default_schema_name = connection.execute(
                    sa.text("SELECT current_schema()")
                ).scalar_one()
                # Two deploys migrating at once would race on CREATE SCHEMA and the version
                # table; a transaction-scoped advisory lock serialises them.
                connection.execute(
                    sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                    {"key": f"txn_offsets.store.migrate:{schema}"},
                )
                if create_schema:
                    connection.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise MigrationError("--sql", "-", "offline (--sql) mode is not supported; run against a database")
run_migrations_online()
