"""Reaching PostgreSQL: the engine for a :class:`DatabaseSettings` (and the cache of one per
Python worker process, for Spark tasks), and the translation of driver errors into the library's
errors.

Only errors about *reaching* the database (unreachable, authentication, terminated connection)
and about *our* tables being absent are translated; everything else (a bug, a constraint of the
caller's own tables) keeps its original type. Messages never contain a secret: the URL is
always rendered redacted and the driver's text is scrubbed of every secret the settings hold (the
password, secret query parameters such as ``sslpassword=``) as a second guard.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import DBAPIConnection

from txn_offsets.config import DatabaseSettings, check_database_tls
from txn_offsets.errors import SchemaMissing, ServiceUnavailable
from txn_offsets.store.pooler import make_pooler_safe, options_refused

__all__ = [
    "dispose_worker_engines",
    "engine_for",
    "is_connection_lost",
    "is_lock_timeout",
    "is_read_only",
    "is_retryable",
    "is_statement_timeout",
    "sqlstate",
    "translate_errors",
    "worker_engine",
]

logger = logging.getLogger(__name__)

# 42P01 undefined_table, 3F000 invalid_schema_name, 42703 undefined_column (tables out of date)
_MISSING_SCHEMA = frozenset({"42P01", "3F000", "42703"})
# 40001 serialization_failure, 40P01 deadlock_detected: the transaction was rolled back, retry is safe
_RETRYABLE = frozenset({"40001", "40P01"})
# 08* connection exceptions, 28* invalid authorization, 57P0* operator intervention (terminate,
# shutdown), 53300 too_many_connections, 3D000 invalid_catalog_name (database does not exist)
_UNREACHABLE_PREFIXES = ("08", "28", "57P0", "53300", "3D000")
# 25006 read_only_sql_transaction: the server takes no writes (a standby, or a primary in a planned
# switchover). Like a lost connection: nothing was written, and a new connection through a
# multi-host URL (target_session_attrs=read-write) reaches the primary. The connection is discarded.
_READ_ONLY = "25006"
_LOCK_NOT_AVAILABLE = "55P03"
# A pooled connection idle for longer than this is pinged before it is handed out (a restarted
# server or a dropped idle socket is then replaced silently). One in steady use is not: the ping
# would be one more round trip per transaction, and the callers that open transactions in the hot
# path treat a connection lost before COMMIT as "nothing committed" and retry on a fresh one.
PING_IF_IDLE_S = 2.0
_IDLE_SINCE = "txn_offsets_idle_since"
# (pool_size, max_overflow): a driver, CLI or admin process (engine_for's defaults), and each
# Python worker of an executor (worker_engine). A full pool makes the caller wait, never connect:
# the connection budget of a run is built from these (store.budget)
DRIVER_POOL = (2, 3)
WORKER_POOL = (1, 1)
_QUERY_CANCELED = "57014"


def engine_for(db: DatabaseSettings, **kwargs: object) -> sa.Engine:
    """An engine for `db`: a pool of :data:`DRIVER_POOL` (unless `kwargs` say otherwise), bounded
    connect time, TCP keepalives, the server-side timeouts of `db` (see
    :meth:`DatabaseSettings.connect_args`), parameters kept out of error messages, and safe behind
    a transaction-pooling PgBouncer (no prepared statements; the timeouts set in each
    transaction when the pooler dropped them; statement pooling refused: :mod:`.pooler`).
    A server beyond loopback without ``sslmode=verify-full`` / ``verify-ca`` is warned about once
    per process, or refused under ``TXN_OFFSETS_REQUIRE_TLS=1``
    (:func:`txn_offsets.config.check_database_tls`).

    `kwargs` go to :func:`sqlalchemy.create_engine` and override the defaults; a ``connect_args``
    among them is merged over ``db.connect_args()`` (so overriding one argument keeps the others).
    """
    # prepared statements off: they do not follow the client across a transaction pooler's
    # server connections (txn_offsets.store.pooler); a caller's connect_args may turn them on
    connect_args: dict[str, object] = {**db.connect_args(), "prepare_threshold": None}
    extra = kwargs.pop("connect_args", None)
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise TypeError(f"connect_args must be a mapping, got {type(extra).__name__}")
        connect_args.update(extra)
    # beyond loopback without verified TLS: a warning once per process, or TXN_OFFSETS_REQUIRE_TLS=1's refusal
    check_database_tls(db, connect_args)
    options: dict[str, object] = {"hide_parameters": True}
    if "poolclass" not in kwargs:
        options.update(pool_size=DRIVER_POOL[0], max_overflow=DRIVER_POOL[1])
    options.update(kwargs)
    options["connect_args"] = connect_args
    engine = sa.create_engine(db.url, **options)
    make_pooler_safe(engine, db)
    _drop_read_only(engine)
    if not options.get("pool_pre_ping"):
        _ping_when_idle(engine)
    return engine


_engines: dict[DatabaseSettings, sa.Engine] = {}
_engines_lock = threading.Lock()


def worker_engine(db: DatabaseSettings) -> sa.Engine:
    """One engine per Python worker process and database settings (Spark reuses the worker between
    tasks): the same engine options as everywhere (timeouts, keepalives, parameters hidden from
    error text, which would otherwise quote record keys and values)."""
    with _engines_lock:
        engine = _engines.get(db)
        if engine is None:
            if not _engines:
                atexit.register(dispose_worker_engines)
            # one task per worker at a time: its transaction and, when a commit's outcome is
            # unknown, the re-read on a fresh connection
            engine = engine_for(db, pool_size=WORKER_POOL[0], max_overflow=WORKER_POOL[1])
            _engines[db] = engine
        return engine


def dispose_worker_engines() -> None:
    """Close the pooled connections of this worker (at interpreter exit: the server sees a clean
    goodbye instead of a dropped socket)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _drop_read_only(engine: sa.Engine) -> None:
    """A read-only server's connection is a disconnect (SQLSTATE 25006): SQLAlchemy invalidates it
    and the pool's older connections, so the next checkout connects anew and libpq's
    ``target_session_attrs=read-write`` picks the (new) primary instead of the read-only one."""

    @sa.event.listens_for(engine, "handle_error")
    def _read_only(context: sa.engine.ExceptionContext) -> None:
        if getattr(context.original_exception, "sqlstate", None) == _READ_ONLY:
            context.is_disconnect = True


def _ping_when_idle(engine: sa.Engine) -> None:
    """SQLAlchemy's pessimistic disconnect handling, for idle connections only."""

    @sa.event.listens_for(engine.pool, "checkin")
    def _checked_in(dbapi_connection: DBAPIConnection, record: sa.pool.ConnectionPoolEntry) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @sa.event.listens_for(engine.pool, "checkout")
    def _checked_out(
        dbapi_connection: DBAPIConnection,
        record: sa.pool.ConnectionPoolEntry,
        proxy: sa.pool.PoolProxiedConnection,
    ) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since <= PING_IF_IDLE_S:
            return  # just connected, or in steady use
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # the pool discards this connection and hands out a new one
            raise sa.exc.DisconnectionError("pooled connection found dead") from exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error wrapped by SQLAlchemy (None if there is none)."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_retryable(exc: BaseException) -> bool:
    """A serialization failure or deadlock: Postgres rolled the transaction back."""
    return isinstance(exc, sa.exc.DBAPIError) and sqlstate(exc) in _RETRYABLE


def is_lock_timeout(exc: BaseException) -> bool:
    """A lock was not granted in time (SQLSTATE 55P03 lock_not_available): ``lock_timeout``
    expired, or ``NOWAIT`` found the lock taken. The statement failed; the transaction is aborted."""
    return isinstance(exc, sa.exc.DBAPIError) and sqlstate(exc) == _LOCK_NOT_AVAILABLE


def is_statement_timeout(exc: BaseException) -> bool:
    """The statement was cancelled (SQLSTATE 57014 query_canceled): ``statement_timeout`` expired,
    or someone cancelled it (``pg_cancel_backend``); PostgreSQL uses the same code for both."""
    return isinstance(exc, sa.exc.DBAPIError) and sqlstate(exc) == _QUERY_CANCELED


def is_read_only(exc: BaseException) -> bool:
    """The server refused a write as read-only (SQLSTATE 25006): a standby, or a primary being
    switched over. Nothing was written; see :func:`is_connection_lost`."""
    return isinstance(exc, sa.exc.DBAPIError) and sqlstate(exc) == _READ_ONLY


def is_connection_lost(exc: BaseException) -> bool:
    """The connection broke (network 08*, server restart or shutdown 57P0*, ``pg_terminate_backend``)
    or reached a server that takes no writes (25006, a failover): transient, a new connection may
    reach the (new) primary."""
    if not isinstance(exc, sa.exc.DBAPIError) or is_retryable(exc):
        return False
    if exc.connection_invalidated:
        return True
    state = sqlstate(exc)
    if state is None:
        return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError)
    return state == _READ_ONLY or state.startswith(_UNREACHABLE_PREFIXES)


def _detail(exc: BaseException, db: DatabaseSettings) -> str:
    """The first line of the driver's message, scrubbed of every secret of `db`."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig)
    # before splitting into lines (a secret may contain a newline); longest first, so a secret
    # containing another is replaced whole; URL-quoted forms too, should the driver echo part
    # of a connection string
    for secret in db.secret_values():
        for form in dict.fromkeys((secret, quote(secret, safe=""), quote_plus(secret, safe=""))):
            text = text.replace(form, "***")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


@contextlib.contextmanager
def translate_errors(db: DatabaseSettings) -> Iterator[None]:
    """Turn "cannot reach the database" and "our tables are missing" into our errors."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        state = sqlstate(exc)
        if state in _MISSING_SCHEMA:
            raise SchemaMissing(db.schema, _detail(exc, db)) from None
        refused = options_refused(exc, db)
        if refused is not None:
            raise refused from None
        if is_connection_lost(exc):
            logger.debug("database error on %r: sqlstate %r", db.display_url, state)
            detail = _detail(exc, db)
            if state == _READ_ONLY:
                detail += (
                    " (the server is read-only: a standby, or a primary being switched over; list every "
                    "host in the URL with target_session_attrs=read-write to reach the primary)"
                )
            raise ServiceUnavailable("PostgreSQL", db.display_url, detail) from exc
        raise
