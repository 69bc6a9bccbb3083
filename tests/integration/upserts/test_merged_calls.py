"""merging_upserts: consecutive upsert_add calls of one table sent as ONE statement leave the table
as the calls one after the other do, on a real PostgreSQL - keys shared by calls summed, NULL add
values, NULL keys (never merged), a key repeated in one call (the same CardinalityViolation), both
paths (unnest, COPY) - and a statement on the connection sees the held rows first."""

from __future__ import annotations

import contextlib
import decimal
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txn_offsets import upserts
from txn_offsets.errors import ConfigError
from txn_offsets.upserts import merging_upserts, upsert_add

KEYS = ["k", "j"]
ADD = ["n", "d", "f"]
PATHS = {"unnest": 10**9, "copy": 1}


@pytest.fixture
def table(engine: sa.Engine, pg_schema: str) -> sa.Table:
    metadata = sa.MetaData(schema=pg_schema)
    made = sa.Table(
        "t",
        metadata,
        sa.Column("k", sa.Text),
        sa.Column("j", sa.Integer),
        sa.Column("n", sa.BigInteger),
        sa.Column("d", sa.Numeric(14, 2)),
        sa.Column("f", sa.Float(precision=53)),
        sa.UniqueConstraint(*KEYS),  # NULLs distinct: a NULL key is a row of its own
    )
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(pg_schema))
        metadata.create_all(conn)
    return made


def outcome(engine: sa.Engine, table: sa.Table, calls: list[list[dict[str, Any]]], *, merged: bool) -> Any:
    """The table after `calls` in one transaction (then emptied), or the error's classes; and the
    INSERT statements sent."""
    inserts: list[str] = []
    try:
        with engine.begin() as conn:
            sa.event.listen(
                conn, "before_cursor_execute", lambda *a: inserts.append(a[2]) if "INSERT" in a[2] else None
            )
            with merging_upserts(conn) if merged else contextlib.nullcontext():
                for rows in calls:
                    assert upsert_add(conn, table, rows, keys=KEYS, add=ADD) == len(rows)
            got = conn.execute(sa.select(table).order_by(*table.c)).all()
            conn.execute(table.delete())
    except sa.exc.DBAPIError as exc:
        return ("error", type(exc.orig).__name__), inserts
    return ("ok", [tuple(r) for r in got]), inserts


_row = st.fixed_dictionaries(
    {
        "k": st.sampled_from(["a", "b", "c"]) | st.none(),
        "j": st.integers(0, 2),
        "n": st.none() | st.integers(-(2**40), 2**40),
        "d": st.none() | st.decimals(-(10**6), 10**6, places=2) | st.integers(-(10**6), 10**6),
        "f": st.none() | st.integers(-(2**20), 2**20).map(float),  # exact: any order sums alike
    }
)


@st.composite
def calls(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    out = []
    most = draw(st.sampled_from([1, 6]))  # half the examples one row a call (a per-range write's)
    for _ in range(draw(st.integers(1, 5))):
        rows = draw(st.lists(_row, min_size=1, max_size=most))
        if not draw(st.integers(0, 4)):  # now and then a key repeated in one call
            out.append(rows)
            continue
        out.append(list({(r["k"], r["j"]) if r["k"] is not None else id(r): r for r in rows}.values()))
    return out


@contextlib.contextmanager
def path(name: str) -> Iterator[None]:
    with mock.patch.object(upserts, "COPY_MIN_ROWS", PATHS[name]):
        yield


@pytest.mark.parametrize("name", sorted(PATHS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(example=calls())
def test_merged_calls_leave_the_table_as_the_calls_one_by_one(
    engine: sa.Engine, table: sa.Table, name: str, example: list[list[dict[str, Any]]]
) -> None:
    with path(name):
        alone, _ = outcome(engine, table, example, merged=False)
        merged, _ = outcome(engine, table, example, merged=True)
    assert merged == alone


def test_consecutive_calls_go_as_one_statement_and_a_read_sees_them(
    engine: sa.Engine, table: sa.Table
) -> None:
    rows = [
        [{"k": "a", "j": j, "n": i, "d": decimal.Decimal(i), "f": 1.0} for j in range(3)] for i in range(10)
    ]
    (ok, got), inserts = outcome(engine, table, rows, merged=True)
    assert ok == "ok" and len(inserts) == 1  # 10 calls, one INSERT (10 without merging)
    assert [(k, j, n) for k, j, n, _, _ in got] == [("a", j, 45) for j in range(3)]
    with engine.begin() as conn, merging_upserts(conn):
        upsert_add(conn, table, rows[1], keys=KEYS, add=ADD)
        upsert_add(conn, table, rows[2], keys=KEYS, add=ADD)
        read = conn.execute(sa.select(sa.func.sum(table.c.n))).scalar_one()  # held rows sent first
        conn.execute(table.delete())
    assert read == 9


@pytest.mark.parametrize("name", sorted(PATHS))
def test_one_row_calls_are_summed_without_numbering_each_call_s_rows(
    engine: sa.Engine, table: sa.Table, name: str
) -> None:
    """A call of one row cannot repeat a key of its own: such calls are grouped by the keys alone
    (no row_number() window, no call column); a call of several rows keeps both, and its repeated
    key still fails as that call alone does."""
    one = [[{"k": "a", "j": i % 3, "n": i, "d": 1, "f": 1.0}] for i in range(9)]
    with path(name):
        (ok, got), inserts = outcome(engine, table, one, merged=True)
        assert ok == "ok" and len(inserts) == 1 and "row_number()" not in inserts[0]
        assert "c_call" not in inserts[0]
        assert [(k, j, n, d) for k, j, n, d, _ in got] == [("a", j, sum(range(j, 9, 3)), 3) for j in range(3)]
        several = [
            *one,
            [{"k": "b", "j": 0, "n": 1, "d": 1, "f": 1.0}, {"k": "b", "j": 1, "n": 1, "d": 1, "f": 1.0}],
        ]
        (ok, _), inserts = outcome(engine, table, several, merged=True)
        assert ok == "ok" and len(inserts) == 1 and "row_number()" in inserts[0]
        repeated = [*one, [{"k": "b", "j": 0, "n": 1, "d": 1, "f": 1.0}] * 2]
        assert outcome(engine, table, repeated, merged=True)[0] == ("error", "CardinalityViolation")


def test_a_held_call_is_not_held_inside_a_savepoint(engine: sa.Engine, table: sa.Table) -> None:
    """A call's error inside ``begin_nested`` is raised there and rolled back to the savepoint,
    as without merging; the calls held before it are kept."""
    good = {"k": "a", "j": 1, "n": 1, "d": 1, "f": 1.0}
    with engine.begin() as conn:
        with merging_upserts(conn):
            upsert_add(conn, table, [good], keys=KEYS, add=ADD)
            with pytest.raises(sa.exc.DBAPIError) as info, conn.begin_nested():
                upsert_add(conn, table, [{**good, "k": "b"}] * 2, keys=KEYS, add=ADD)
            upsert_add(conn, table, [good], keys=KEYS, add=ADD)
        got = conn.execute(sa.select(table.c.k, table.c.n)).all()
        conn.execute(table.delete())
    assert type(info.value.orig).__name__ == "CardinalityViolation"
    assert [tuple(r) for r in got] == [("a", 2)]


def test_a_held_calls_bad_value_is_the_same_config_error_when_sent(
    engine: sa.Engine, table: sa.Table
) -> None:
    good = {"k": "a", "j": 1, "n": 1, "d": 1, "f": 1.0}
    with pytest.raises(ConfigError) as alone, engine.begin() as conn:
        upsert_add(conn, table, [{**good, "n": "7"}], keys=KEYS, add=ADD)
    with pytest.raises(ConfigError) as merged, engine.begin() as conn, merging_upserts(conn):
        upsert_add(conn, table, [good], keys=KEYS, add=ADD)
        upsert_add(conn, table, [{**good, "k": "b", "n": "7"}], keys=KEYS, add=ADD)  # held: sent at the end
    assert str(merged.value) == str(alone.value) and "'n'" in str(merged.value)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0
