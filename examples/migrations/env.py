"""alembic environment for the examples' result tables (schema txn_examples, own version table).

Run through :func:`examples.migrate.upgrade`; the URL comes from Config.attributes or
TXN_OFFSETS_DATABASE_URL, never from a file or the command line.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from sqlalchemy.pool import NullPool

from examples.schema import SCHEMA, metadata
from txn_offsets.config import database_from_env
from txn_offsets.store.database import engine_for

db = context.config.attributes.get("db") or database_from_env()
engine = engine_for(db, poolclass=NullPool)
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=lambda name, type_, _parents: type_ != "schema" or name == SCHEMA,
    )
    with context.begin_transaction():
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('txn_examples.migrate'))"))
        connection.execute(sa.schema.CreateSchema(SCHEMA, if_not_exists=True))
        context.run_migrations()
engine.dispose()
