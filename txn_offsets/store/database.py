"""Reaching PostgreSQL: the engine for a :class:`DatabaseSettings`, and the translation of driver
errors into the library's errors.

Only errors about *reaching* the database (unreachable, authentication, terminated connection)
and about *our* tables being absent are translated; everything else (a bug, a constraint of the
caller's own tables) keeps its original type. Messages never contain the password: the URL is
always rendered redacted and the driver's text is scrubbed of the password as a second guard.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import SchemaMissing, ServiceUnavailable

__all__ = ["engine_for", "is_connection_lost", "is_retryable", "sqlstate", "translate_errors"]

logger = logging.getLogger(__name__)

# 42P01 undefined_table, 3F000 invalid_schema_name, 42703 undefined_column (tables out of date)
_MISSING_SCHEMA = frozenset({"42P01", "3F000", "42703"})
# 40001 serialization_failure, 40P01 deadlock_detected: the transaction was rolled back, retry is safe
_RETRYABLE = frozenset({"40001", "40P01"})
# 08* connection exceptions, 28* invalid authorization, 57P0* operator intervention (terminate,
# shutdown), 53300 too_many_connections, 3D000 invalid_catalog_name (database does not exist)
_UNREACHABLE_PREFIXES = ("08", "28", "57P0", "53300", "3D000")


def engine_for(db: DatabaseSettings, **kwargs: object) -> sa.Engine:
    """An engine for `db`: bounded connect time, parameters kept out of error messages."""
    options: dict[str, object] = {
        "pool_pre_ping": True,
        "hide_parameters": True,
        "connect_args": {"connect_timeout": max(1, round(db.connect_timeout_s))},
    }
    options.update(kwargs)
    return sa.create_engine(db.url, **options)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error wrapped by SQLAlchemy (None if there is none)."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_retryable(exc: BaseException) -> bool:
    """A serialization failure or deadlock: Postgres rolled the transaction back."""
    return isinstance(exc, sa.exc.DBAPIError) and sqlstate(exc) in _RETRYABLE


def is_connection_lost(exc: BaseException) -> bool:
    """The connection broke (network, server restart, ``pg_terminate_backend``)."""
    if not isinstance(exc, sa.exc.DBAPIError) or is_retryable(exc):
        return False
    if exc.connection_invalidated:
        return True
    state = sqlstate(exc)
    if state is None:
        return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError)
    return state.startswith(_UNREACHABLE_PREFIXES)


def _detail(exc: BaseException, db: DatabaseSettings) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    text = lines[0] if lines else type(orig).__name__
    password = db.url.password
    if password:
        text = text.replace(str(password), "***")
    return text


@contextlib.contextmanager
def translate_errors(db: DatabaseSettings) -> Iterator[None]:
    """Turn "cannot reach the database" and "our tables are missing" into our errors."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        state = sqlstate(exc)
        if state in _MISSING_SCHEMA:
            raise SchemaMissing(db.schema, _detail(exc, db)) from None
        if is_connection_lost(exc):
            logger.debug("database error on %r: sqlstate %r", db.display_url, state)
            raise ServiceUnavailable("PostgreSQL", db.display_url, _detail(exc, db)) from exc
        raise
