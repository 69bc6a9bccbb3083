"""Connections through a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``).

Such a pooler hands each *transaction* to any server connection of its pool, so nothing a session
sets may outlive the transaction that set it. :func:`engine_for
<txn_offsets.store.database.engine_for>` keeps every engine safe behind one:

- psycopg's server-side prepared statements are off (``prepare_threshold=None``): before
  PgBouncer 1.21 a statement prepared by one client lands on a server connection another client
  gets next (``DuplicatePreparedStatement``, ``prepared statement ... does not exist``);
- the staging table of :func:`txn_offsets.upserts.upsert_add` is created in the transaction and
  dropped at its commit;
- the PostgreSQL settings of :meth:`DatabaseSettings.server_settings
  <txn_offsets.config.DatabaseSettings.server_settings>` (``lock_timeout``, ``statement_timeout``,
  ``idle_in_transaction_session_timeout``, and the server's end of the TCP bounds:
  ``tcp_keepalives_idle`` / ``_interval`` / ``_count``, ``tcp_user_timeout``) travel in libpq's
  ``options`` on a direct connection. PgBouncer drops ``options`` (``ignore_startup_parameters =
  options``; without it PgBouncer refuses the connection: ``translate_errors`` makes that a
  :class:`ConfigError`), so each new connection checks that the server session really has them
  (``pg_settings.source = 'client'``, the timeouts with our values); a connection that does not is
  marked pooled, and every transaction on it starts with ``set_config(..., true)`` (``SET LOCAL``):
  one more round trip per transaction, behind a pooler only. A frozen holder of a claim then still
  costs ``lock_timeout_s``, not forever;
- a half-open client (its host cut off inside a transaction: no FIN, no RST, its row locks held)
  is dropped by the server's own keepalives after :func:`half_open_s`, so a retry of its ranges
  elsewhere waits that long at most, and the cut-off transaction can never commit later. Behind
  PgBouncer these bound the pooler's server connection; the pooler's client side is bounded by its
  own ``tcp_keepalive``/``tcp_keepidle``/``tcp_keepintvl``/``tcp_keepcnt``/``tcp_user_timeout``
  (a client lost inside a transaction makes it close that server connection: a rollback);
- statement pooling cannot run a multi-statement transaction at all (every write of txn_offsets
  is one): the check above fails with PgBouncer's "transaction blocks not allowed in statement
  pooling mode" and is a :class:`ConfigError` naming ``pool_mode``.

The library takes no advisory session locks (the migrations' lock is transaction-scoped) and
uses no LISTEN/NOTIFY.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, cast

import psycopg
import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError

__all__ = ["POOLED", "half_open_s", "lacking", "make_pooler_safe", "options_refused", "pooled"]

logger = logging.getLogger(__name__)

POOLED = "txn_offsets_pooled"  # connection record info: the session lacks our startup settings
_STATEMENT_POOLING = "statement pooling mode"
_UNSUPPORTED_OPTIONS = "unsupported startup parameter: options"


#: set by value, but checked by source only: pg_settings shows the socket's actual value, which is
#: the kernel's default for 0 and 0 over a Unix socket (where they do not apply)
_TCP = frozenset(
    {"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"}
)


def half_open_s(db: DatabaseSettings) -> float | None:
    """The longest the server keeps the session of a silent client (its host cut off while idle in
    a transaction: the server has nothing to send, so its keepalives decide), counted from the last
    packet it received; None when a keepalive setting is 0 (the kernel's default: hours). Linux
    probes after ``idle`` s, then every ``interval`` s, and drops the connection at the first probe
    after ``count`` unanswered ones - or, with ``tcp_user_timeout`` set, at the first probe (>= 1)
    at which that much time passed since the last packet, whatever ``count`` says."""
    idle, interval, count = db.tcp_keepalives_idle_s, db.tcp_keepalives_interval_s, db.tcp_keepalives_count
    if not (idle and interval and count):
        return None
    user_ms = int(db.server_settings()["tcp_user_timeout"])  # what the server is given: whole ms
    if user_ms == 0:
        return float(idle + interval * count)
    return float(idle + interval * max(1, math.ceil((user_ms - idle * 1000) / (interval * 1000))))


def lacking(wanted: dict[str, str], rows: Iterable[tuple[str, str, str]]) -> list[str]:
    """The names of `wanted` a session lacks, from its pg_settings (name, setting, source) rows:
    not set by the client's startup packet, or (a timeout) set to another value."""
    ours = {name: setting for name, setting, source in rows if source == "client"}
    return [n for n, v in wanted.items() if n not in ours or (n not in _TCP and ours[n] != v)]


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
    """True if this connection's session lacks the startup settings (a pooler dropped them)."""
    return bool(connection.connection.info.get(POOLED))


def make_pooler_safe(engine: sa.Engine, db: DatabaseSettings) -> None:
    """Install the connect check and the per-transaction settings on `engine` (see the module)."""
    wanted = db.server_settings()
    set_local = "SELECT " + ", ".join(
        f"set_config('{name}', '{value}', true)" for name, value in wanted.items()
    )

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
        record.info[POOLED] = bool(lacking(wanted, rows))
        if record.info[POOLED]:
            logger.debug("%s: startup settings absent (a pooler?): set per transaction", db.display_url)

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
