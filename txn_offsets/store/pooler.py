"""Connections through a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``).

Such a pooler hands each *transaction* to any server connection of its pool, so nothing a session
sets may outlive the transaction that set it. :func:`engine_for
<txn_offsets.store.database.engine_for>` keeps every engine safe behind one:

- psycopg's server-side prepared statements are off (``prepare_threshold=None``): before
  PgBouncer 1.21 a statement prepared by one client lands on a server connection another client
  gets next (``DuplicatePreparedStatement``, ``prepared statement ... does not exist``);
- the staging table of :func:`txn_offsets.upserts.upsert_add` is created in the transaction and
  dropped at its commit;
- the PostgreSQL timeouts (``lock_timeout``, ``statement_timeout``,
  ``idle_in_transaction_session_timeout``) travel in libpq's ``options`` on a direct connection.
  PgBouncer drops ``options`` (``ignore_startup_parameters = options``; without it PgBouncer
  refuses the connection: ``translate_errors`` makes that a :class:`ConfigError`), so each new
  connection checks that the server session really has them (``pg_settings.source = 'client'``
  with our values); a connection that does not is marked pooled, and every transaction on it starts with
  ``set_config(..., true)`` (``SET LOCAL``): one more round trip per transaction, behind a pooler
  only. A frozen holder of a claim then still costs ``lock_timeout_s``, not forever;
- statement pooling cannot run a multi-statement transaction at all (every write of txn_offsets
  is one): the check above fails with PgBouncer's "transaction blocks not allowed in statement
  pooling mode" and is a :class:`ConfigError` naming ``pool_mode``.

The library takes no advisory session locks (the migrations' lock is transaction-scoped) and
uses no LISTEN/NOTIFY.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import psycopg
import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError

__all__ = ["POOLED", "make_pooler_safe", "options_refused", "pooled"]

logger = logging.getLogger(__name__)

POOLED = "txn_offsets_pooled"  # connection record info: the session lacks our startup timeouts
_STATEMENT_POOLING = "statement pooling mode"
_UNSUPPORTED_OPTIONS = "unsupported startup parameter: options"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000)) if seconds > 0 else 0


def _timeouts(db: DatabaseSettings) -> dict[str, str]:
    """The server settings and their values as pg_settings shows them (milliseconds)."""
    return {
        "lock_timeout": str(_ms(db.lock_timeout_s)),
        "statement_timeout": str(_ms(db.statement_timeout_s)),
        "idle_in_transaction_session_timeout": str(_ms(db.idle_in_transaction_timeout_s)),
    }


def options_refused(exc: BaseException, db: DatabaseSettings) -> ConfigError | None:
    """The ConfigError for a pooler that refused libpq's ``options`` at connect, else None."""
    if _UNSUPPORTED_OPTIONS not in str(getattr(exc, "orig", None) or exc):
        return None
    return ConfigError(
        "database",
        f"{db.display_url} refuses libpq's 'options' startup parameter (PgBouncer): add "
        "'ignore_startup_parameters = options' to its [pgbouncer] section; txn_offsets then sets its "
        "timeouts in each transaction",
    )


def _statement_pooling(db: DatabaseSettings) -> ConfigError:
    return ConfigError(
        "database",
        f"{db.display_url} is a connection pooler in statement pooling mode (PgBouncer: 'transaction "
        "blocks not allowed in statement pooling mode'), which cannot run a transaction, and every "
        "txn_offsets write is one: set pool_mode = transaction (or session) for this database or user",
    )


def pooled(connection: sa.Connection) -> bool:
    """True if this connection's session lacks the startup timeouts (a pooler dropped them)."""
    return bool(connection.connection.info.get(POOLED))


def make_pooler_safe(engine: sa.Engine, db: DatabaseSettings) -> None:
    """Install the connect check and the per-transaction timeouts on `engine` (see the module)."""
    wanted = _timeouts(db)
    set_local = "SELECT " + ", ".join(f"set_config('{name}', '{ms}ms', true)" for name, ms in wanted.items())

    # insert=True: before SQLAlchemy's own first-connect queries, which statement pooling also fails
    @sa.event.listens_for(engine, "connect", insert=True)
    def _connected(dbapi_connection: Any, record: sa.pool.ConnectionPoolEntry) -> None:
        raw = cast("psycopg.Connection[Any]", dbapi_connection)
        try:
            rows = raw.execute(
                "SELECT name, setting, source FROM pg_catalog.pg_settings WHERE name = ANY(%s)",
                (list(wanted),),
            ).fetchall()
            if not raw.autocommit:
                raw.rollback()
        except psycopg.OperationalError as exc:
            if _STATEMENT_POOLING in str(exc):
                raw.close()
                raise _statement_pooling(db) from None
            raise
        ours = {name: setting for name, setting, source in rows if source == "client"}
        record.info[POOLED] = ours != wanted
        if record.info[POOLED]:
            logger.debug("%s: startup timeouts absent (a pooler?): set per transaction", db.display_url)

    @sa.event.listens_for(engine, "begin")
    def _began(connection: sa.Connection) -> None:
        proxied = connection.connection
        if not proxied.info.get(POOLED):
            return
        raw = cast("psycopg.Connection[Any]", proxied.driver_connection)
        if raw.autocommit:
            return  # each statement is its own transaction: nothing to set locally
        try:
            raw.execute(set_local)
        except psycopg.Error as exc:
            lost = connection.dialect.is_disconnect(cast("Any", exc), proxied.dbapi_connection, None)
            wrapped = sa.exc.DBAPIError.instance(
                set_local,
                None,
                exc,
                psycopg.Error,
                hide_parameters=True,
                connection_invalidated=lost,
                dialect=connection.dialect,
            )
            if lost:
                connection.invalidate(exc)
            raise cast("BaseException", wrapped) from exc
