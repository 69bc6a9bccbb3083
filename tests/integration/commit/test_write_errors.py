"""Every error PostgreSQL raises inside a unit's transaction leaves as WriteFailed, without values.

A write may go through SQLAlchemy or straight through the raw DBAPI cursor; PostgreSQL's messages may
quote what the write sent (a trigger's RAISE with NEW's columns, a syntax error "at or near" a
fragment, a data exception's input). Spark logs a task's exception with its message and its chained
causes, so none of it may leave the commit core: only the error class, SQLSTATE, object names, and
the primary message of the SQLSTATEs whose messages name objects only (issue 42 item 4)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import WriteFailed
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

SECRET = "card_4111111111111111"  # a record payload (one SQL token): never in an error


@pytest.fixture
def table(engine: sa.Engine, migrated: DatabaseSettings) -> str:
    name = f'"{migrated.schema}".payloads'
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {name} (v text PRIMARY KEY, n int)"))
        conn.execute(sa.text(f"INSERT INTO {name} VALUES (:v, 1)"), {"v": SECRET})
        conn.execute(
            sa.text(
                f"""CREATE FUNCTION "{migrated.schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.n < 0 THEN RAISE EXCEPTION 'refused value %', NEW.v; END IF;
                    RETURN NEW;
                END $$"""
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {name} FOR EACH ROW "
                f'EXECUTE FUNCTION "{migrated.schema}".refuse()'
            )
        )
    return name


def _raw(sql: str, params: tuple[object, ...] = ()) -> Callable[[sa.Connection], None]:
    """A write through the raw DBAPI cursor (psycopg's), outside SQLAlchemy."""

    def write(conn: sa.Connection) -> None:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute(sql, params)

    return write


def _orm(sql: str, params: dict[str, object]) -> Callable[[sa.Connection], None]:
    def write(conn: sa.Connection) -> None:
        conn.execute(sa.text(sql), params)

    return write


CASES = {
    # unique violation through the raw cursor: escaped the wrapper, DETAIL "Key (v)=(<payload>)"
    "raw unique violation": (lambda t: _raw(f"INSERT INTO {t} VALUES (%s, 1)", (SECRET,)), "23505", True),
    # a trigger's RAISE quoting the value: its message held the payload
    "trigger raise": (
        lambda t: _orm(f"INSERT INTO {t} VALUES (:v, -1)", {"v": SECRET + "x"}),
        "P0001",
        False,
    ),
    "raw trigger raise": (
        lambda t: _raw(f"INSERT INTO {t} VALUES (%s, -1)", (SECRET + "y",)),
        "P0001",
        False,
    ),
    # a syntax error "at or near" a fragment of the statement the write built from a value
    "syntax error": (lambda t: _orm(f"INSERT INTO {t} VALUES ('a', 1) {SECRET}", {}), "42601", False),
    # a data exception quoting its input
    "data exception": (lambda t: _raw(f"INSERT INTO {t} VALUES ('b', %s::int)", (SECRET,)), "22P02", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_write_error_leaves_as_write_failed_without_values(
    case: str, engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, table: str
) -> None:
    make, state, primary = CASES[case]
    seed(engine, migrated, run.job, {("t", 0): 0})
    with pytest.raises(WriteFailed) as info:
        commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], make(table))
    error = info.value
    assert error.sqlstate == state and error.job == run.job
    shown = f"{error} {error!r} {error.where} {error.error}"
    assert SECRET not in shown, shown
    # nothing chained: Spark logs an exception with its causes and context
    assert error.__cause__ is None and error.__suppress_context__
    # the primary message only where it names objects alone
    assert ("duplicate key value violates unique constraint" in error.where) is primary
    assert "payloads" in error.where or state in {"42601", "22P02", "P0001"}
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 0}  # nothing committed
