"""upsert_add's two paths on a real PostgreSQL: column arrays through unnest below
``COPY_MIN_ROWS`` rows, binary COPY into a staging table + one merge from there on. Both must
leave the same table contents for the same calls, in the caller's transaction."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txn_offsets import upserts
from txn_offsets.errors import ConfigError
from txn_offsets.store.database import is_connection_lost
from txn_offsets.upserts import upsert_add

KEYS = ["k", "b", "w"]
ADD = ["n", "d", "f"]
Row = dict[str, Any]


def _table(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("k", sa.Text, primary_key=True),
        sa.Column("b", sa.BigInteger, primary_key=True),
        sa.Column("w", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("n", sa.BigInteger),
        sa.Column("d", sa.Numeric),
        sa.Column("f", sa.Float(precision=53)),
    )


@pytest.fixture
def tables(engine: sa.Engine, pg_schema: str) -> dict[str, sa.Table]:
    metadata = sa.MetaData(schema=pg_schema)
    made = {name: _table(metadata, name) for name in ("unnest", "copy", "mixed")}
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(pg_schema))
        metadata.create_all(conn)
    return made


@contextlib.contextmanager
def copy_from(rows: int) -> Iterator[None]:
    """Calls with at least `rows` rows take the COPY path, smaller ones unnest."""
    with mock.patch.object(upserts, "COPY_MIN_ROWS", rows):
        yield


class Statements:
    """The statements a connection sends through SQLAlchemy (the COPY itself goes to the driver)."""

    def __init__(self, conn: sa.Connection) -> None:
        self.sent: list[str] = []
        sa.event.listen(conn, "before_cursor_execute", self._record)

    def _record(self, _conn: sa.Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        self.sent.append(statement)

    def merged_from_staging(self) -> bool:
        return any("FROM pg_temp.txn_offsets_upsert_" in s for s in self.sent)

    def unnested(self) -> bool:
        return any("unnest(" in s for s in self.sent)


def write(conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> int:
    return upsert_add(conn, table, rows, keys=KEYS, add=ADD)


def contents(engine: sa.Engine, table: sa.Table) -> list[tuple[Any, ...]]:
    """Every row, numbers as PostgreSQL's text (exact, and NaN compares equal to itself)."""
    query = sa.select(table.c.k, table.c.b, table.c.w, *(sa.cast(table.c[c], sa.Text) for c in ADD)).order_by(
        *(table.c[c] for c in KEYS)
    )
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query)]


def rows_of(n: int, *, k: str = "key", start: int = 0, value: int = 1) -> list[Row]:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        {"k": f"{k}-{i}", "b": -i, "w": when, "n": value, "d": decimal.Decimal(value), "f": float(value)}
        for i in range(start, start + n)
    ]


def _unique_keys(rows: list[Row]) -> list[Row]:
    return list({(r["k"], r["b"], r["w"]): r for r in rows}.values())


# unicode keys (no NUL: PostgreSQL text cannot hold it), negative numbers, time zones, and NULLs
# in every added column; sums stay in range (an overflow fails both paths alike)
_row = st.fixed_dictionaries(
    {
        "k": st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8),
        "b": st.integers(-(2**62), 2**62),
        "w": st.datetimes(
            min_value=dt.datetime(1970, 1, 1),
            max_value=dt.datetime(2100, 1, 1),
            timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-5, minutes=-30))]),
        ),
        "n": st.none() | st.integers(-(2**61), 2**61),
        "d": st.none() | st.decimals(-(10**15), 10**15, places=6, allow_nan=False),
        "f": st.none() | st.floats(-1e300, 1e300, allow_nan=False),
    }
)
_batches = st.lists(st.lists(_row, max_size=40).map(_unique_keys), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_batches)
def test_both_paths_and_any_threshold_leave_the_same_rows(
    engine: sa.Engine, tables: dict[str, sa.Table], batches: list[list[Row]]
) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {', '.join(t.fullname for t in tables.values())}"))
    # every call through unnest; every call through COPY; and a threshold inside the sizes, so
    # that the same keys are written by one path and then added to by the other. The first batch
    # comes again at the end: every one of its rows then adds into an existing row.
    for name, threshold in (("unnest", 10**9), ("copy", 1), ("mixed", 12)):
        with copy_from(threshold):
            for batch in [*batches, batches[0]]:
                with engine.begin() as conn:
                    seen = Statements(conn)
                    assert write(conn, tables[name], batch) == len(batch)
                if batch:
                    assert seen.merged_from_staging() == (len(batch) >= threshold), name
    expected = contents(engine, tables["unnest"])
    assert contents(engine, tables["copy"]) == expected
    assert contents(engine, tables["mixed"]) == expected


def test_the_copy_path_starts_at_copy_min_rows(engine: sa.Engine, tables: dict[str, sa.Table]) -> None:
    threshold = upserts.COPY_MIN_ROWS
    assert 500 <= threshold <= 5_000
    with engine.begin() as conn:
        below = Statements(conn)
        write(conn, tables["unnest"], rows_of(threshold - 1))
    with engine.begin() as conn:
        at = Statements(conn)
        write(conn, tables["copy"], rows_of(threshold))
    assert below.unnested()
    assert not below.merged_from_staging()
    assert at.merged_from_staging()
    assert not at.unnested()
    last = f"key-{threshold - 1}"  # the one row more
    assert [r for r in contents(engine, tables["copy"]) if r[0] != last] == contents(engine, tables["unnest"])


def test_two_calls_in_one_transaction_add_up(engine: sa.Engine, tables: dict[str, sa.Table]) -> None:
    table = tables["copy"]
    with copy_from(1), engine.begin() as conn:
        seen = Statements(conn)
        write(conn, table, rows_of(30, value=1))
        # overlaps the first call on 10-29: the staging table must not still hold the first rows
        # (merging them again would add them twice, or fail as duplicates)
        write(conn, table, rows_of(30, start=10, value=5))
        assert seen.merged_from_staging()
    got = {r[0]: int(r[3]) for r in contents(engine, table)}
    assert got == {f"key-{i}": (1 if i < 10 else 6 if i < 30 else 5) for i in range(40)}


def test_a_rollback_leaves_nothing_and_the_next_transaction_starts_empty(
    engine: sa.Engine, tables: dict[str, sa.Table]
) -> None:
    table = tables["copy"]
    with copy_from(1), engine.connect() as conn:
        seen = Statements(conn)
        with conn.begin() as tx:
            write(conn, table, rows_of(50, k="gone"))
            tx.rollback()
        with conn.begin():
            write(conn, table, rows_of(20, k="kept"))
        with conn.begin():  # the staging table of the session, committed before: empty again
            write(conn, table, rows_of(5, k="later"))
    assert seen.merged_from_staging()
    got = sorted(r[0] for r in contents(engine, table))
    assert got == sorted([f"kept-{i}" for i in range(20)] + [f"later-{i}" for i in range(5)])


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE", "AUTOCOMMIT"])
def test_every_isolation_level_writes_every_row(
    engine: sa.Engine, tables: dict[str, sa.Table], level: str
) -> None:
    table = tables["copy"]
    with engine.connect() as base:
        conn = base.execution_options(isolation_level=level)
        with conn.begin():
            seen = Statements(conn)
            write(conn, table, rows_of(upserts.COPY_MIN_ROWS, value=2))
            write(conn, table, rows_of(upserts.COPY_MIN_ROWS, value=3))
    # AUTOCOMMIT has no transaction to keep staged rows in (ON COMMIT DELETE ROWS): unnest
    assert seen.merged_from_staging() == (level != "AUTOCOMMIT")
    got = contents(engine, table)
    assert len(got) == upserts.COPY_MIN_ROWS
    assert {int(r[3]) for r in got} == {5}


@pytest.mark.parametrize("threshold", [1, 10**9], ids=["copy", "unnest"])
def test_floats_and_ints_convert_the_same_way(
    engine: sa.Engine, tables: dict[str, sa.Table], threshold: int
) -> None:
    """Floats go as float8, ints into a float column as int8, and PostgreSQL casts them to the
    column's type: a float into the numeric column keeps PostgreSQL's 15 digits in both paths. A
    column mixing ints and floats writes each value as a call of its own would (both paths)."""
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {"k": "a", "b": 2**40, "w": when, "n": 7, "d": 0.1 + 0.2, "f": 3},
        {"k": "b", "b": -1, "w": when, "n": 2**62, "d": 1e20, "f": 2**60 + 1},
    ]
    with copy_from(threshold), engine.begin() as conn:
        seen = Statements(conn)
        write(conn, tables["copy"], rows)
        write(conn, tables["copy"], [{**rows[0], "k": "c"}, {**rows[1], "k": "e", "d": 5}])
    assert seen.merged_from_staging() == (threshold == 1)
    got = contents(engine, tables["copy"])
    assert [r[3:] for r in got] == [
        ("7", "0.3", "3"),
        (str(2**62), "100000000000000000000", "1.152921504606847e+18"),
        ("7", "0.3", "3"),
        (str(2**62), "5", "1.152921504606847e+18"),
    ]


@pytest.mark.parametrize("threshold", [1, 10**9], ids=["copy", "unnest"])
def test_duplicate_keys_in_one_call_fail_alike(
    engine: sa.Engine, tables: dict[str, sa.Table], threshold: int
) -> None:
    rows = rows_of(3) + rows_of(1)
    with copy_from(threshold), pytest.raises(sa.exc.ProgrammingError) as info, engine.begin() as conn:
        write(conn, tables["copy"], rows)
    assert getattr(info.value.orig, "sqlstate", None) == "21000"  # cardinality_violation
    assert contents(engine, tables["copy"]) == []


def test_a_copy_error_is_a_dbapi_error_without_the_values(
    engine: sa.Engine, tables: dict[str, sa.Table]
) -> None:
    """PostgreSQL rejects a row during the COPY (here a CHECK constraint the test adds to the
    staging table, in the same transaction): the error is SQLAlchemy's (so that commit_ranges
    classifies it as it classifies the merge's, and reports it as WriteFailed without its text:
    PostgreSQL's DETAIL quotes the failing row) and its SQL part holds no values. (Values of the
    wrong type or out of range never get this far: upsert_add refuses them before sending.)"""
    rows = rows_of(5)
    rows[3] = {**rows[3], "k": "payload-secret"}

    def check(_conn: sa.Connection, cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("CREATE TEMP TABLE"):
            stage = re.search(r"pg_temp\.txn_offsets_upsert_\w+", statement)
            assert stage is not None
            cursor.execute(f"ALTER TABLE {stage[0]} ADD CONSTRAINT clean CHECK (strpos(c0_0, 'secret') = 0)")

    with copy_from(1), pytest.raises(sa.exc.IntegrityError) as info, engine.begin() as conn:
        sa.event.listen(conn, "after_cursor_execute", check)
        write(conn, tables["copy"], rows)
    assert getattr(info.value.orig, "sqlstate", None) == "23514"  # check_violation
    assert info.value.params is None and "secret" not in info.value.statement
    assert info.value.statement.startswith("COPY pg_temp.txn_offsets_upsert_")


@pytest.mark.parametrize("threshold", [1, 10**9], ids=["copy", "unnest"])
def test_a_missing_column_is_a_config_error(
    engine: sa.Engine, tables: dict[str, sa.Table], threshold: int
) -> None:
    rows = rows_of(1_000)
    rows[7] = {c: v for c, v in rows[7].items() if c != "d"}
    with copy_from(threshold), engine.begin() as conn:
        seen = Statements(conn)
        with pytest.raises(ConfigError, match="a row has no value for column 'd'") as info:
            write(conn, tables["copy"], rows)
        assert "key-7" not in str(info.value)
        with pytest.raises(ConfigError, match="has no column"):
            upsert_add(conn, tables["copy"], rows_of(1_000), keys=KEYS, add=["missing"])
    assert seen.sent == []  # nothing was sent
    assert contents(engine, tables["copy"]) == []


def test_a_connection_lost_during_the_copy_is_reported_as_lost(
    engine: sa.Engine, tables: dict[str, sa.Table]
) -> None:
    """The backend dies between the staging table and the COPY: the error is SQLAlchemy's, says
    the connection is gone (commit_ranges turns that into ServiceUnavailable) and the pooled
    connection is invalidated, as SQLAlchemy does for a statement of its own."""
    with engine.connect() as conn:
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

        def kill(_conn: sa.Connection, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.startswith("CREATE TEMP TABLE"):
                with engine.connect() as other:
                    assert other.execute(
                        sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid}
                    ).scalar()

        sa.event.listen(conn, "after_cursor_execute", kill)
        with copy_from(1), pytest.raises(sa.exc.OperationalError) as info:
            write(conn, tables["copy"], rows_of(10))
        assert info.value.connection_invalidated
        assert is_connection_lost(info.value)
        assert "COPY pg_temp.txn_offsets_upsert_" in str(info.value)
        assert conn.invalidated
