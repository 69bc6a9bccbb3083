"""Set-based writes for the user's results: one statement per call, never row by row.

:func:`upsert_add` adds partial aggregates into a result table (``ON CONFLICT ... DO UPDATE SET
n = t.n + excluded.n``). Small inputs go as column arrays through ``unnest``; from
:data:`COPY_MIN_ROWS` rows on they are streamed with a binary ``COPY`` into a temporary staging
table and merged with one ``INSERT ... SELECT``, which costs a fraction of the client CPU. Both
paths convert every value the same way (see :func:`_staging_types`), write rows in key order and
fail the same way (duplicate keys in one call: ``CardinalityViolation``). Values are always sent
as data, never as SQL; identifiers come from the SQLAlchemy Table, quoted by the dialect.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import psycopg
import sqlalchemy as sa
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy.dialects import postgresql

from txn_offsets.errors import ConfigError

__all__ = ["COPY_MIN_ROWS", "upsert_add"]

_DIALECT: sa.Dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

# From this many rows on, COPY + merge is faster than unnest, commit included (measured on 2
# cores, window_counts rows: even at 200-300 rows, COPY 1.1-1.4x faster at 500-1,000, 1.8-2.2x at
# 10,000-100,000 rows).
COPY_MIN_ROWS = 500

# statements without parameters: sent as they are (a % in a quoted name is not a placeholder)
_NO_PARAMETERS: dict[str, Any] = {"no_parameters": True}


class _Stage(NamedTuple):
    """How the COPY path carries a column: the staging column's type and the Python types whose
    binary form psycopg writes for it exactly as the unnest path's array would hold them."""

    sql: str
    accepts: frozenset[type]


_NONE = type(None)
_INT = _Stage("int8", frozenset({int, _NONE}))
# by the element type of the array psycopg sends for the column in the unnest path; "" is an
# untyped (unknown) array - all str, which PostgreSQL parses as the column's type
_STAGES = {
    "": _Stage("text", frozenset({str, _NONE})),
    "int2": _INT,
    "int4": _INT,
    "int8": _INT,
    "numeric": _Stage("numeric", frozenset({decimal.Decimal, int, _NONE})),
    "float8": _Stage("float8", frozenset({float, _NONE})),
    "bool": _Stage("bool", frozenset({bool, _NONE})),
    "timestamptz": _Stage("timestamptz", frozenset({dt.datetime, _NONE})),
    "timestamp": _Stage("timestamp", frozenset({dt.datetime, _NONE})),
    "date": _Stage("date", frozenset({dt.date, _NONE})),
    "uuid": _Stage("uuid", frozenset({uuid.UUID, _NONE})),
    "bytea": _Stage("bytea", frozenset({bytes, _NONE})),
}


def upsert_add(
    conn: sa.Connection,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str],
    add: Sequence[str],
) -> int:
    """Insert `rows`, adding the `add` columns into rows whose `keys` already exist. Returns the
    number of rows sent. `keys` must be the columns of a unique index of `table`; rows are written
    in key order so that concurrent writers of overlapping keys cannot deadlock. Rows with the same
    key in one call fail (PostgreSQL's ``CardinalityViolation``): aggregate them first.

    Runs in the caller's transaction (it never commits or rolls back). From :data:`COPY_MIN_ROWS`
    rows on it stages them in a session-local temporary table, ``pg_temp.txn_offsets_upsert_*``
    (emptied at the start of each call and at commit). It uses unnest whatever the size on an
    AUTOCOMMIT connection, and for a column holding values of other Python types than str, int,
    Decimal, float, bool, datetime, date, UUID or bytes (exactly these, or None)."""
    if not rows:
        return 0
    columns = [*keys, *add]
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ConfigError("upsert_add", f"table {table.fullname} has no column(s) {', '.join(unknown)}")
    if not add or not keys:
        raise ConfigError("upsert_add", "give at least one key column and one column to add")
    try:
        values = [[row[col] for row in rows] for col in columns]
    except KeyError as exc:
        raise ConfigError("upsert_add", f"a row has no value for column {exc.args[0]!r}") from None
    prep = _DIALECT.identifier_preparer
    target = prep.format_table(table)
    types = [table.c[c].type.compile(dialect=_DIALECT) for c in columns]
    # Rows in key order: concurrent transactions (one per range) that touch the same keys then
    # lock them in the same order and wait for each other instead of deadlocking. The order is
    # PostgreSQL's (ORDER BY the key columns), the same in both paths.
    order = ", ".join(str(i + 1) for i in range(len(keys)))
    sets = ", ".join(f"{prep.quote(c)} = {target}.{prep.quote(c)} + excluded.{prep.quote(c)}" for c in add)
    tail = f"ORDER BY {order} ON CONFLICT ({', '.join(prep.quote(c) for c in keys)}) DO UPDATE SET {sets}"
    insert = f"INSERT INTO {target} ({', '.join(prep.quote(c) for c in columns)}) SELECT "
    raw = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    staged = _staging_types(raw, values) if len(rows) >= COPY_MIN_ROWS and not raw.autocommit else None
    if staged is None:
        arrays = ", ".join(f"CAST(:c{i} AS {t}[])" for i, t in enumerate(types))
        conn.execute(
            sa.text(f"{insert}* FROM unnest({arrays}) {tail}"),
            {f"c{i}": column for i, column in enumerate(values)},
        )
        return len(rows)
    stage = _copy(conn, raw, [s.sql for _, s in staged], values)
    selected = ", ".join(
        # through the array's element type when the staging type is wider (int8 for int2)
        f"CAST(s.c{i} AS {t})" if element in {"", s.sql} else f"CAST(CAST(s.c{i} AS {element}) AS {t})"
        for i, (t, (element, s)) in enumerate(zip(types, staged, strict=True))
    )
    conn.exec_driver_sql(f"{insert}{selected} FROM {stage} AS s {tail}", execution_options=_NO_PARAMETERS)
    return len(rows)


def _staging_types(raw: psycopg.Connection[Any], values: list[list[Any]]) -> list[tuple[str, _Stage]] | None:
    """For each column, the element type of the array psycopg sends for it in the unnest path
    (``int2`` for small ints, ``float8`` for floats, ``""`` for str: untyped) and how to stage it;
    None if a column holds values the COPY path does not carry (the unnest path then takes them,
    and raises its own error if they cannot be sent at all).

    Staged values are cast to this element type, then to the column's type: exactly the
    conversions of the unnest path (a float into a numeric column goes through float8 in both)."""
    tx = Transformer(raw)
    out = []
    for column in values:
        try:
            oid = tx.get_dumper(column, PyFormat.AUTO).oid
        except psycopg.Error:
            return None
        info = psycopg.postgres.types.get(oid) if oid else None
        element = "" if oid == 0 else info.name if info is not None and info.array_oid == oid else None
        stage = _STAGES.get(element) if element is not None else None
        if stage is None or not set(map(type, column)) <= stage.accepts:
            return None
        out.append((cast("str", element), stage))
    return out


def _copy(
    conn: sa.Connection, raw: psycopg.Connection[Any], types: list[str], values: list[list[Any]]
) -> str:
    """Empty the staging table for these column types (creating it if the session has none), COPY
    the rows into it and return its name. Driver errors of the COPY are wrapped as SQLAlchemy
    wraps its own (the statement has no parameters, so the SQL part holds no values)."""
    stage = f"pg_temp.txn_offsets_upsert_{hashlib.sha256(' '.join(types).encode()).hexdigest()[:16]}"
    definition = ", ".join(f"c{i} {t}" for i, t in enumerate(types))
    create = f"CREATE TEMP TABLE IF NOT EXISTS {stage} ({definition}) ON COMMIT DELETE ROWS"
    # emptied first: a second call in the same transaction must not merge the first call's rows
    conn.exec_driver_sql(f"{create}; DELETE FROM {stage}", execution_options=_NO_PARAMETERS)  # noqa: S608
    statement = f"COPY {stage} FROM STDIN (FORMAT BINARY)"
    try:
        with raw.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(types)
            for row in zip(*values, strict=True):
                copy.write_row(row)
    except psycopg.Error as exc:
        raise _wrapped(conn, statement, exc) from exc
    return stage


def _wrapped(conn: sa.Connection, statement: str, exc: psycopg.Error) -> BaseException:
    """`exc` as SQLAlchemy's DBAPIError (what the rest of the library and the caller classify),
    the connection invalidated if it is gone, as SQLAlchemy does for its own statements."""
    lost = conn.dialect.is_disconnect(cast("Any", exc), conn.connection.dbapi_connection, None)
    wrapped = sa.exc.DBAPIError.instance(
        statement,
        None,
        exc,
        psycopg.Error,
        hide_parameters=conn.engine.hide_parameters,
        connection_invalidated=lost,
        dialect=conn.dialect,
    )
    if lost:
        conn.invalidate(exc)
    return cast("BaseException", wrapped)
