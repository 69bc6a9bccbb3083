"""upsert_add's two paths (unnest below ``COPY_MIN_ROWS`` rows, binary COPY from there on) accept
and refuse exactly the same inputs, on a real PostgreSQL: any mix of Python values in columns of
the usual types (NULLs, naive and aware datetimes, ints in float columns, out-of-range ints, NUL in
text, values of types no column takes) gives the same table, or the same error class and message.

The rule for datetimes is PostgreSQL's own, value by value: in a ``timestamptz`` column an aware
value is that instant and a naive one is taken in the session's TimeZone (as PostgreSQL reads a
timestamp without time zone); in a ``timestamp`` column a naive value is kept as it is and an aware
one becomes its wall-clock time in the session's TimeZone (PostgreSQL's timestamptz -> timestamp
cast). So a row is written the same whatever other rows share its call and its column."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from txn_offsets import upserts
from txn_offsets.errors import ConfigError
from txn_offsets.upserts import upsert_add

KEYS = ["id", "i4", "txt", "b", "ts", "tstz"]
ADD = ["i8", "num", "f8"]
SESSION_TZ = "Asia/Kolkata"  # +05:30: a naive value read in it is not the same as read in UTC
PATHS = {"unnest": 10**9, "copy": 1}


def _table(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.BigInteger, nullable=False),
        sa.Column("i4", sa.Integer),
        sa.Column("txt", sa.Text),
        sa.Column("b", sa.Boolean),
        sa.Column("ts", sa.DateTime(timezone=False)),
        sa.Column("tstz", sa.DateTime(timezone=True)),
        sa.Column("i8", sa.BigInteger),
        sa.Column("num", sa.Numeric),
        sa.Column("f8", sa.Float(precision=53)),
        sa.UniqueConstraint(*KEYS),  # NULLs are distinct: ON CONFLICT (KEYS) infers it
    )


@pytest.fixture
def tables(engine: sa.Engine, pg_schema: str) -> dict[str, sa.Table]:
    metadata = sa.MetaData(schema=pg_schema)
    made = {path: _table(metadata, path) for path in PATHS}
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(pg_schema))
        metadata.create_all(conn)
    return made


@contextlib.contextmanager
def path(name: str) -> Iterator[None]:
    with mock.patch.object(upserts, "COPY_MIN_ROWS", PATHS[name]):
        yield


def outcome(engine: sa.Engine, table: sa.Table, name: str, rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    """('ok', every row as PostgreSQL's text) or ('error', class, message): the driver's message
    (the SQL of the two paths differs, what PostgreSQL or the check said must not)."""
    try:
        with path(name), engine.begin() as conn:
            conn.execute(sa.text(f"SET LOCAL TimeZone = '{SESSION_TZ}'"))
            seen: list[str] = []
            sa.event.listen(conn, "before_cursor_execute", lambda *a: seen.append(a[2]))
            assert upsert_add(conn, table, rows, keys=KEYS, add=ADD) == len(rows)
            staged = any("FROM pg_temp.txn_offsets_upsert_" in s for s in seen)
            assert staged == (name == "copy"), seen
            got = conn.execute(sa.select(*(sa.cast(c, sa.Text) for c in table.c)).order_by(table.c.id)).all()
    except sa.exc.DBAPIError as exc:
        return ("error", type(exc).__name__, type(exc.orig).__name__, str(exc.orig).splitlines()[0])
    except (ConfigError, TypeError, ValueError) as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("ok", [tuple(r) for r in got])


_naive = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
_zones = st.sampled_from(
    [dt.UTC, dt.timezone(dt.timedelta(hours=-8)), dt.timezone(dt.timedelta(hours=5, minutes=45))]
)
_aware = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=_zones)
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)  # may hold a NUL
# every column's values: mostly of the kinds it takes (mixed ones included), NULLs
GOOD = {
    "i4": st.none()
    | st.integers(-1000, 1000)
    | st.integers(-(2**31), 2**31 - 1)
    | st.sampled_from([-(2**31), 2**31]),
    "txt": st.none() | _text,
    "b": st.none() | st.booleans(),
    "ts": st.none() | _naive | _aware,
    "tstz": st.none() | _naive | _aware,
    "i8": st.none() | st.integers(-(2**62), 2**62) | st.sampled_from([2**63 - 1, 2**63]),
    "num": st.none() | st.decimals(allow_nan=True) | st.integers() | st.floats(),
    "f8": st.none() | st.floats() | st.integers(-(2**53), 2**53),
}
# anything at all: what one column may get in an example (types no column takes included)
ANY = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.decimals(),
    _text,
    st.booleans(),
    _naive,
    _aware,
    st.dates(),
    st.uuids(),
    st.binary(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.just({"a": 1}),
)


@st.composite
def inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    wild = draw(st.none() | st.none() | st.sampled_from([*GOOD]))  # a column of anything, in 1/3
    n = draw(st.integers(1, 6))
    return [
        {"id": i, **{c: draw(ANY if c == wild else strategy) for c, strategy in GOOD.items()}}
        for i in range(n)
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=inputs())
def test_both_paths_accept_and_refuse_the_same_inputs(
    engine: sa.Engine, tables: dict[str, sa.Table], rows: list[dict[str, Any]]
) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {', '.join(t.fullname for t in tables.values())}"))
    unnest = outcome(engine, tables["unnest"], "unnest", rows)
    event(str(unnest[1]) if unnest[0] == "error" else "ok")  # see --hypothesis-show-statistics
    assert outcome(engine, tables["copy"], "copy", rows) == unnest


NAIVE = dt.datetime(2026, 1, 1, 12, 0)
AWARE = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))  # 10:00 UTC


@pytest.mark.parametrize("name", PATHS)
def test_naive_and_aware_datetimes_in_one_column_follow_postgresql(
    engine: sa.Engine, tables: dict[str, sa.Table], name: str
) -> None:
    """Each value as PostgreSQL converts it alone (session TimeZone +05:30): the mixed column
    gives what the same values give in calls of their own."""
    rows = [
        {"id": i, "i4": 1, "txt": "t", "b": True, "ts": when, "tstz": when, "i8": 1, "num": 1, "f8": 1.0}
        for i, when in enumerate([NAIVE, AWARE, None, AWARE, NAIVE])
    ]
    got = outcome(engine, tables[name], name, rows)
    assert got[0] == "ok", got
    assert [(r[4], r[5]) for r in got[1]] == [
        ("2026-01-01 12:00:00", "2026-01-01 12:00:00+05:30"),  # naive: as is; read in +05:30
        ("2026-01-01 15:30:00", "2026-01-01 15:30:00+05:30"),  # aware: 10:00 UTC, shown in +05:30
        (None, None),
        ("2026-01-01 15:30:00", "2026-01-01 15:30:00+05:30"),
        ("2026-01-01 12:00:00", "2026-01-01 12:00:00+05:30"),
    ]


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("i4", 2**31, "column 'i4' (INTEGER): an int value is out of its range"),
        ("i8", True, "column 'i8' (BIGINT) takes int values (or None), not bool"),
        ("i8", [1, 2], "column 'i8' (BIGINT) takes int values (or None), not list"),
        ("txt", 7, "column 'txt' (TEXT) takes str values (or None), not int"),
        ("txt", "payload-\x00-secret", "column 'txt' (TEXT): a str value holds a NUL character"),
        ("b", 1, "column 'b' (BOOLEAN) takes bool values (or None), not int"),
        ("tstz", dt.date(2026, 1, 1), "column 'tstz' (TIMESTAMP WITH TIME ZONE) takes"),
        ("num", "1.5", "column 'num' (NUMERIC) takes"),
        ("f8", decimal.Decimal("1e400"), "column 'f8' (FLOAT(53)): a Decimal value is out of its range"),
        ("num", uuid.UUID(int=5), "not UUID"),
    ],
)
def test_refused_values_name_the_column_never_the_value(
    engine: sa.Engine, tables: dict[str, sa.Table], name: str, column: str, value: Any, message: str
) -> None:
    rows = [
        {"id": i, "i4": 1, "txt": "t", "b": True, "ts": NAIVE, "tstz": AWARE, "i8": 1, "num": 1, "f8": 1.0}
        for i in range(3)
    ]
    rows[1] = {**rows[1], column: value}
    got = outcome(engine, tables[name], name, rows)
    assert got[:2] == ("error", "ConfigError") and message in got[2], got
    assert "secret" not in got[2]
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables[name])).scalar() == 0
