"""Set-based writes for the user's results: one statement per call, never row by row.

:func:`upsert_add` adds partial aggregates into a result table (``ON CONFLICT ... DO UPDATE SET
n = t.n + excluded.n``) from column arrays passed through ``unnest``; values are always bound
parameters and identifiers come from the SQLAlchemy Table, quoted by the dialect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from txn_offsets.errors import ConfigError

__all__ = ["upsert_add"]

_DIALECT: sa.Dialect = postgresql.dialect()  # type: ignore[no-untyped-call]


def upsert_add(
    conn: sa.Connection,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str],
    add: Sequence[str],
) -> int:
    """Insert `rows`, adding the `add` columns into rows whose `keys` already exist. Returns the
    number of rows sent. `keys` must be the columns of a unique index of `table`; rows are sent in
    key order so that concurrent writers of overlapping keys cannot deadlock."""
    if not rows:
        return 0
    columns = [*keys, *add]
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ConfigError("upsert_add", f"table {table.fullname} has no column(s) {', '.join(unknown)}")
    if not add or not keys:
        raise ConfigError("upsert_add", "give at least one key column and one column to add")
    prep = _DIALECT.identifier_preparer
    target = prep.format_table(table)
    names = ", ".join(prep.quote(c) for c in columns)
    arrays = ", ".join(
        f"CAST(:c{i} AS {table.c[c].type.compile(dialect=_DIALECT)}[])" for i, c in enumerate(columns)
    )
    sets = ", ".join(f"{prep.quote(c)} = {target}.{prep.quote(c)} + excluded.{prep.quote(c)}" for c in add)
    conflict = ", ".join(prep.quote(c) for c in keys)
    statement = sa.text(
        f"INSERT INTO {target} ({names}) SELECT * FROM unnest({arrays}) "  # noqa: S608 - identifiers quoted
        f"ON CONFLICT ({conflict}) DO UPDATE SET {sets}"
    )
    try:
        # Rows in key order: concurrent transactions (one per range) that touch the same keys then
        # lock them in the same order and wait for each other instead of deadlocking.
        ordered = sorted(rows, key=lambda row: tuple((row[k] is not None, row[k]) for k in keys))
        params = {f"c{i}": [row[col] for row in ordered] for i, col in enumerate(columns)}
    except KeyError as exc:
        raise ConfigError("upsert_add", f"a row has no value for column {exc.args[0]!r}") from None
    conn.execute(statement, params)
    return len(rows)
