"""Set-based writes for the user's results: one statement per call, never row by row.

:func:`upsert_add` adds partial aggregates into a result table (``ON CONFLICT ... DO UPDATE SET
n = t.n + excluded.n``). Small inputs go as column arrays through ``unnest``; from
:data:`COPY_MIN_ROWS` rows on they are streamed with a binary ``COPY`` into a temporary staging
table and merged with one ``INSERT ... SELECT``, which costs a fraction of the client CPU. Both
paths take every value through one conversion table (:data:`_TABLE`: the column's type and the
value's kind -> the type it is sent as, then one SQL cast to the column's type), write rows in key
order and fail the same way (a value the table refuses: ``ConfigError`` naming the column, before
anything is sent; duplicate keys in one call: ``CardinalityViolation``). Values are always sent
as data, never as SQL; identifiers come from the SQLAlchemy Table, quoted by the dialect.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import functools
import hashlib
import math
import operator
import re
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from txn_offsets.errors import ConfigError

__all__ = ["COPY_MIN_ROWS", "merging_upserts", "upsert_add"]

_DIALECT: sa.Dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

# From this many rows on, COPY + merge is faster than unnest, commit included (measured on 2
# cores, window_counts rows: even at 200-300 rows, COPY 1.1-1.4x faster at 500-1,000, 1.8-2.2x at
# 10,000-100,000 rows).
COPY_MIN_ROWS = 500

# statements without parameters: sent as they are (a % in a quoted name is not a placeholder)
_NO_PARAMETERS: dict[str, Any] = {"no_parameters": True}


# THE conversion table, used by both paths. A column's type (as the dialect names it, without its
# length or precision) -> {the kind of a Python value it takes: the type both paths send such values
# as}. The unnest path sends each such group as an array of that type, the COPY path stages it in a
# column of that type; both then select CAST(it AS the column's type): the same values reach the
# same SQL cast, so the paths cannot differ. A column of a type outside the table (JSON, INTERVAL,
# arrays, enums...) goes through psycopg's own adaptation, always by unnest. The first entry is the
# type a column of only NULLs is sent as.
_TABLE: dict[str, dict[str, str]] = {
    "integer": {"int": "int8"},  # range-checked against the column's width before sending
    "numeric": {"Decimal": "numeric", "int": "numeric", "float": "float8"},  # float: PostgreSQL's cast
    "float": {"float": "float8", "int": "int8", "Decimal": "float8"},  # Decimal: by Python's float()
    "text": {"str": "text"},  # no NUL (PostgreSQL text cannot hold one)
    "boolean": {"bool": "bool"},
    # datetimes as PostgreSQL converts each value alone: an aware value into timestamp is its
    # wall-clock time in the session's TimeZone, a naive one into timestamptz is read in it
    "timestamptz": {"aware datetime": "timestamptz", "naive datetime": "timestamp"},
    "timestamp": {"naive datetime": "timestamp", "aware datetime": "timestamptz"},
    "date": {"date": "date"},
    "uuid": {"UUID": "uuid"},
    "bytea": {"bytes": "bytea"},
}
_CATEGORY = {
    **dict.fromkeys(["SMALLINT", "INTEGER", "BIGINT"], "integer"),
    **dict.fromkeys(["NUMERIC", "DECIMAL"], "numeric"),
    **dict.fromkeys(["FLOAT", "REAL", "DOUBLE PRECISION"], "float"),
    **dict.fromkeys(["TEXT", "VARCHAR", "CHAR"], "text"),
    "BOOLEAN": "boolean",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    **dict.fromkeys(["TIMESTAMP WITHOUT TIME ZONE", "TIMESTAMP"], "timestamp"),
    "DATE": "date",
    "UUID": "uuid",
    "BYTEA": "bytea",
}
_INT_LIMIT = {"SMALLINT": 2**15, "INTEGER": 2**31}  # everything else that takes an int: 2**63
_KINDS: dict[type, str] = {  # a value's kind by its exact type (the fast path)
    int: "int",
    bool: "bool",
    float: "float",
    decimal.Decimal: "Decimal",
    str: "str",
    dt.date: "date",
    uuid.UUID: "UUID",
    bytes: "bytes",
}
# subclasses (IntEnum, numpy.float64, bytearray...), converted to the base type; bool before int
_BASES: list[tuple[type | tuple[type, ...], str]] = [
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (decimal.Decimal, "Decimal"),
    (str, "str"),
    (dt.date, "date"),
    (uuid.UUID, "UUID"),
    ((bytes, bytearray, memoryview), "bytes"),
]
_CONVERT: dict[str, Any] = {"int8": int, "float8": float, "text": str, "bytea": bytes}
# PostgreSQL's numeric: up to 131072 digits before the decimal point, 16383 after
_NUMERIC_DIGITS = (131072, 16383)


class _Column(NamedTuple):
    """How both paths send one column: per group of its values, (the type they are sent as, the
    column's values of that group with None in the other rows)."""

    slots: list[tuple[str, list[Any]]]
    staged: bool  # False: a type outside the table, sent by unnest only


def _merged(casts: list[str]) -> str:
    return casts[0] if len(casts) == 1 else f"COALESCE({', '.join(casts)})"


def _kind(value: Any) -> str:
    kind = _KINDS.get(type(value))
    if kind is not None:
        return kind
    if isinstance(value, dt.datetime):
        return "naive datetime" if value.utcoffset() is None else "aware datetime"
    return next((k for base, k in _BASES if isinstance(value, base)), type(value).__qualname__)


def _refuse(name: str, type_name: str, problem: str) -> ConfigError:
    return ConfigError("upsert_add", f"column {name!r} ({type_name}){problem}")


@functools.lru_cache(maxsize=256)
def _category(type_name: str) -> str | None:
    """The conversion table's category of a column type (None: outside the table)."""
    return _CATEGORY.get(re.sub(r"\(\d+(, *\d+)?\)", "", type_name))


def _column(name: str, type_name: str, values: list[Any]) -> _Column:
    """`values` of column `name` as the conversion table sends them; a ConfigError naming the
    column (never a value) for a value it does not take. Pure Python: nothing is sent yet."""
    category = _category(type_name)
    if category is None:
        return _Column([(type_name, values)], staged=False)
    accepted = _TABLE[category]
    present = set(map(type, values)) - {type(None)}
    only = _KINDS.get(next(iter(present))) if len(present) == 1 else None
    if present == {dt.datetime}:  # all naive or all aware in a fixed offset: no per-value check
        zones = set(map(operator.attrgetter("tzinfo"), filter(None, values)))  # datetimes are truthy
        if zones == {None}:
            only = "naive datetime"
        elif None not in zones and all(type(z) is dt.timezone for z in zones):
            only = "aware datetime"
    if only is not None or not present:  # the fast path: one exact type (or only NULLs)
        kinds: list[str | None] | None = None
        found = {only or next(iter(accepted))}
    else:
        kinds = [None if v is None else _kind(v) for v in values]
        found = {k for k in kinds if k is not None}
    wrong = sorted(found - accepted.keys())
    if wrong:
        raise _refuse(name, type_name, f" takes {', '.join(accepted)} values (or None), not {wrong[0]}")
    slots = []
    for wire in dict.fromkeys(accepted[k] for k in found):
        if kinds is None:
            group = values
        else:
            group = [
                v if k is not None and accepted[k] == wire else None
                for v, k in zip(values, kinds, strict=True)
            ]
        slots.append((wire, _checked(name, type_name, category, wire, group)))
    return _Column(slots, staged=True)


def _checked(name: str, type_name: str, category: str, wire: str, group: list[Any]) -> list[Any]:
    """One group's values checked against the column and converted to the exact Python type
    psycopg sends as `wire` (so that both paths dump them alike)."""
    types = set(map(type, group))
    present = [v for v in group if v is not None] if type(None) in types else group
    types.discard(type(None))
    convert = _CONVERT.get(wire)
    if wire == "int8" and present:
        limit = _INT_LIMIT.get(type_name, 2**63) if category == "integer" else 2**63
        if min(present) < -limit or max(present) >= limit:
            raise _refuse(name, type_name, f": an int value is out of its range ({-limit}..{limit - 1})")
    elif wire == "text" and "\x00" in "".join(present):
        raise _refuse(name, type_name, ": a str value holds a NUL character, which PostgreSQL text cannot")
    elif wire == "numeric" and decimal.Decimal in types:
        nan = False
        for d in present:
            if not isinstance(d, decimal.Decimal):
                continue
            if d.is_nan():
                nan = True
            elif d.is_finite() and (
                d.adjusted() >= _NUMERIC_DIGITS[0] or -int(d.as_tuple().exponent) > _NUMERIC_DIGITS[1]
            ):
                raise _refuse(name, type_name, ": a Decimal value is out of PostgreSQL's numeric range")
        if nan or types != {decimal.Decimal}:  # ints with Decimals (one array type); any NaN as NaN
            return [None if v is None else _to_decimal(v) for v in group]
        return group
    elif wire == "float8" and decimal.Decimal in types:
        out = [None if v is None else _to_float(v) for v in group]
        for f, v in zip(out, group, strict=True):
            if f is not None and math.isinf(f) and isinstance(v, decimal.Decimal) and v.is_finite():
                raise _refuse(name, type_name, ": a Decimal value is out of its range")
        return out
    if convert is not None and types - {convert}:
        return [None if v is None else convert(v) for v in group]
    return group


def _to_decimal(value: Any) -> decimal.Decimal:
    """An int or Decimal as psycopg sends a numeric alike in both paths (any NaN as NaN)."""
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return decimal.Decimal("NaN")
    return decimal.Decimal(value)


def _to_float(value: Any) -> float:
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return math.nan  # float() refuses a signalling NaN
    return float(value)


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
    rows on it stages them in a temporary table, ``pg_temp.txn_offsets_upsert_*``, created in the
    transaction and dropped at its end (emptied at the start of each call: safe behind a
    transaction-pooling PgBouncer). It uses unnest whatever the size on an
    AUTOCOMMIT connection, and when a column's type is outside the conversion table (JSON,
    INTERVAL, arrays...: psycopg's own adaptation). Values a column's type does not take (a str
    in a number column, a bool in an integer column, an int out of range, a list...) are a
    ConfigError naming the column, never the value; naive and aware datetimes may share a column
    (each converted as PostgreSQL converts it alone: docs/configuration.md).

    Inside :func:`merging_upserts` (a PartitionWriter's transaction) the rows may be held back and
    sent with the other calls' rows of the same table as one statement (see there)."""
    if not rows:
        return 0
    call = _Call.of(table, rows, keys, add)
    pending = _PENDING.get(conn)
    if pending is not None and _held(conn, pending, call):
        return len(rows)
    _send(conn, call, _sent(call, call.values))
    return len(rows)


class _Call(NamedTuple):
    """One call's rows as column lists (their values not checked yet: :func:`_sent` does)."""

    table: sa.Table
    keys: tuple[str, ...]
    add: tuple[str, ...]
    types: tuple[str, ...]  # the columns' types as the dialect names them
    values: list[list[Any]]  # per column (keys, then add), the rows' values

    @classmethod
    def of(
        cls, table: sa.Table, rows: Sequence[Mapping[str, Any]], keys: Sequence[str], add: Sequence[str]
    ) -> _Call:
        keys, add = tuple(keys), tuple(add)
        types = _types(table, keys, add)
        try:
            values = [[row[col] for row in rows] for col in (*keys, *add)]
        except KeyError as exc:
            raise ConfigError("upsert_add", f"a row has no value for column {exc.args[0]!r}") from None
        return cls(table, keys, add, types, values)


@functools.lru_cache(maxsize=256)
def _types(table: sa.Table, keys: tuple[str, ...], add: tuple[str, ...]) -> tuple[str, ...]:
    """The columns' types as the dialect names them, once they are checked: once per table and
    columns, not per call - a per-range write calls once per range (compiling a type costs ~20 us,
    a column looked up in the table ~1 us)."""
    columns = (*keys, *add)
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ConfigError("upsert_add", f"table {table.fullname} has no column(s) {', '.join(unknown)}")
    if not add or not keys:
        raise ConfigError("upsert_add", "give at least one key column and one column to add")
    return tuple(table.c[c].type.compile(dialect=_DIALECT) for c in columns)


@functools.lru_cache(maxsize=256)
def _summable(types: tuple[str, ...]) -> bool:
    """Whether every one of these column types adds as ``sum`` does (the held calls' add columns)."""
    return all(_category(t) in _SUMMABLE for t in types)


def _sent(call: _Call, values: list[list[Any]]) -> list[_Column]:
    """`values` (of `call`'s columns) as the conversion table sends them: a value a column does not
    take is a ConfigError naming the column, before anything is sent."""
    return [_column(c, t, v) for c, t, v in zip((*call.keys, *call.add), call.types, values, strict=True)]


def _send(
    conn: sa.Connection,
    call: _Call,
    sent: list[_Column],
    *,
    merged: bool = False,
    calls: list[int] | None = None,
) -> None:
    """One statement (unnest, or COPY + merge) into `call`'s table for the rows of `sent`. `merged`:
    the rows of several calls (:func:`merging_upserts`), summed per key; `calls`: each row's call,
    when a call sent several rows (one of them may repeat a key: see :func:`_select`)."""
    table, keys, add, types = call.table, call.keys, call.add, call.types
    columns = [*keys, *add]
    prep = _DIALECT.identifier_preparer
    target = prep.format_table(table)
    # Rows in key order: concurrent transactions (one per range) that touch the same keys then
    # lock them in the same order and wait for each other instead of deadlocking. The order is
    # PostgreSQL's (ORDER BY the key columns), the same in both paths.
    order = ", ".join(str(i + 1) for i in range(len(keys)))
    sets = ", ".join(f"{prep.quote(c)} = {target}.{prep.quote(c)} + excluded.{prep.quote(c)}" for c in add)
    tail = f"ORDER BY {order} ON CONFLICT ({', '.join(prep.quote(c) for c in keys)}) DO UPDATE SET {sets}"
    insert = f"INSERT INTO {target} ({', '.join(prep.quote(c) for c in columns)}) SELECT "
    slots = [
        (f"c{i}_{j}", wire, group) for i, col in enumerate(sent) for j, (wire, group) in enumerate(col.slots)
    ]
    # each column's value: its group of the row's value cast to the column's type (a value is in
    # one group, NULL in the others), the same expression over an unnest or a staging table
    exprs = [
        _merged([f"CAST(s.c{i}_{j} AS {t})" for j in range(len(col.slots))])
        for i, (t, col) in enumerate(zip(types, sent, strict=True))
    ]
    if calls is not None:
        slots.append(("c_call", "int8", calls))
    raw = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    if len(slots[0][2]) < COPY_MIN_ROWS or raw.autocommit or not all(col.staged for col in sent):
        arrays = ", ".join(f"CAST(:{name} AS {wire}[])" for name, wire, _ in slots)
        source = f"unnest({arrays}) AS s({', '.join(n for n, _, _ in slots)})"
        sql = _select(insert, exprs, len(keys), types, source, merged=merged, per_call=calls is not None)
        conn.execute(sa.text(f"{sql} {tail}"), {name: group for name, _, group in slots})
        return
    stage = _copy(conn, raw, [(name, wire) for name, wire, _ in slots], [group for _, _, group in slots])
    sql = _select(insert, exprs, len(keys), types, f"{stage} AS s", merged=merged, per_call=calls is not None)
    conn.exec_driver_sql(f"{sql} {tail}", execution_options=_NO_PARAMETERS)


def _select(
    insert: str,
    exprs: list[str],
    keys: int,
    types: Sequence[str],
    source: str,
    *,
    merged: bool,
    per_call: bool = False,
) -> str:
    """The INSERT's select over `source` (up to its ORDER BY). `merged`: the rows of several calls,
    summed per key: each add column's sum (NULL if any of its values is NULL, as adding them one
    after the other gives) cast to the column's type. `per_call` (a ``c_call`` column: some call
    sent several rows): grouped by the keys and by the row's number among its own call's rows of
    that key - 1 for all but a call's repeated key, whose second row lands in a group of its own, so
    the statement meets the same CardinalityViolation as that call alone. When every call sent one
    row (a per-range ``write`` of one row a range) no call can repeat a key: grouped by the keys
    alone, without the window's sort (a transaction of 2,048 one-row calls, COPY included: PostgreSQL's
    CPU 40-45 -> 29-38 ms)."""
    if not merged:
        return f"{insert}{', '.join(exprs)} FROM {source}"
    inner = ", ".join(f"{e} AS v{i}" for i, e in enumerate(exprs))
    outer = [f"g.v{i}" for i in range(keys)] + [
        f"CASE WHEN count(g.v{i}) = count(*) THEN CAST(sum(g.v{i}) AS {types[i]}) END"
        for i in range(keys, len(exprs))
    ]
    grouped = [f"g.v{i}" for i in range(keys)]
    if per_call:
        inner += f", row_number() OVER (PARTITION BY s.c_call, {', '.join(exprs[:keys])}) AS dup"
        grouped.append("g.dup")
    return (
        f"{insert}{', '.join(outer)} FROM (SELECT {inner} FROM {source}) AS g "  # noqa: S608
        f"GROUP BY {', '.join(grouped)}"
    )


@contextlib.contextmanager
def merging_upserts(conn: sa.Connection) -> Iterator[None]:
    """Within: consecutive :func:`upsert_add` calls on `conn` into the same table with the same
    keys and add columns are sent as ONE statement, summed per key - what a PartitionWriter's
    per-range ``write`` makes of a transaction's ranges (one statement instead of one per range).

    A call is held back when every add column is a number (integer, numeric, float: ``sum`` adds
    as ``+`` does), no key is NULL and no savepoint is open (``begin_nested``: a call's error is
    raised inside it, as without merging). Its columns are checked at the call; its values (the
    conversion table) when the held calls are sent, all together: a value a column does not take
    is the same ConfigError, raised then. The held calls are sent before any other statement on
    `conn` (a read of the user's sees its earlier writes), before a call that is not held, and
    when the block ends. The rows end up as the calls one after the other leave them: per key the
    sum of its values added once (NULL if any of them is NULL), a key repeated in one call the
    same ``CardinalityViolation``. The differences: floats are summed in another order (rounding),
    only the final sum must fit the column (not each step), a database error of a held call is
    raised by the statement that sends it, and triggers fire once per key. Statements run through
    the driver's own connection (``conn.connection``) do not send them: run such reads on `conn`.
    AUTOCOMMIT connection holds nothing back."""
    raw = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    if conn in _PENDING or raw.autocommit:
        yield
        return
    _PENDING[conn] = []
    sa.event.listen(conn, "before_cursor_execute", _send_held_first)
    try:
        yield
        _send_held(conn)
    finally:
        sa.event.remove(conn, "before_cursor_execute", _send_held_first)
        del _PENDING[conn]


#: the calls each connection inside merging_upserts holds back (consecutive, of one table, keys, add)
_PENDING: weakref.WeakKeyDictionary[sa.Connection, list[_Call]] = weakref.WeakKeyDictionary()
#: the categories of the conversion table whose values sum() adds as `+` does
_SUMMABLE = frozenset({"integer", "numeric", "float"})


def _held(conn: sa.Connection, pending: list[_Call], call: _Call) -> bool:
    """Hold `call` back with the `pending` ones, if it can be merged with them."""
    if pending and pending[0][:3] != call[:3]:
        return False  # another table or other columns: the held calls are sent first
    if conn.in_nested_transaction():
        return False  # its error must be raised inside the savepoint, which rolls back to it
    n = len(call.keys)
    if not _summable(call.types[n:]):
        return False
    if any(v is None for column in call.values[:n] for v in column):
        return False  # NULL keys never conflict (each row its own): not merged
    pending.append(call)
    return True


def _send_held_first(conn: sa.Connection, *_: Any) -> None:
    _send_held(conn)


def _send_held(conn: sa.Connection) -> None:
    """Send the calls `conn` holds back: one alone as it is, several as one merged statement."""
    pending = _PENDING.get(conn)
    if not pending:
        return
    calls = pending[:]
    pending.clear()  # first: the statements sent below run this hook again
    first = calls[0]
    if len(calls) == 1:
        _send(conn, first, _sent(first, first.values))
        return
    values = [[v for call in calls for v in call.values[i]] for i in range(len(first.types))]
    sent = _sent(first, values)  # checked once, all the calls' values together
    # each row's call, needed only where a call of several rows may repeat a key of its own
    several = any(len(call.values[0]) > 1 for call in calls)
    numbers = [n for n, call in enumerate(calls) for _ in call.values[0]] if several else None
    _send(conn, first, sent, merged=True, calls=numbers)


def _copy(
    conn: sa.Connection, raw: psycopg.Connection[Any], columns: list[tuple[str, str]], values: list[list[Any]]
) -> str:
    """Empty the staging table of these (name, type) columns (creating it if the transaction has none),
    COPY the rows into it and return its name. Driver errors of the COPY are wrapped as SQLAlchemy
    wraps its own (the statement has no parameters, so the SQL part holds no values)."""
    definition = ", ".join(f"{name} {wire}" for name, wire in columns)
    stage = f"pg_temp.txn_offsets_upsert_{hashlib.sha256(definition.encode()).hexdigest()[:16]}"
    # created in this transaction and dropped at its end: behind a transaction pooler nothing of the
    # session may outlive the transaction (the next one may run on another server connection)
    create = f"CREATE TEMP TABLE IF NOT EXISTS {stage} ({definition}) ON COMMIT DROP"
    # emptied first: a second call in the same transaction must not merge the first call's rows
    conn.exec_driver_sql(f"{create}; DELETE FROM {stage}", execution_options=_NO_PARAMETERS)  # noqa: S608
    statement = f"COPY {stage} FROM STDIN (FORMAT BINARY)"
    try:
        with raw.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types([wire for _, wire in columns])
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
