"""What the database says about the offset store's health: the offsets table's update counters
(HOT ratio) and size, the oldest open transaction, and how many connections are still free.

Reads only PostgreSQL's statistics views and settings (``pg_stat_user_tables``,
``pg_stat_activity``, ``max_connections``); the service exposes them in ``/metrics``, the runner
checks the connection budget against :func:`connection_headroom`, and the benchmarks measure with
them. Counters of ``pg_stat_user_tables`` are cumulative since the last statistics reset and
reach the view when a backend flushes them (at most about once a second).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings

__all__ = [
    "ConnectionHeadroom",
    "TableStats",
    "connection_headroom",
    "flush_stats",
    "offsets_table_stats",
    "oldest_transaction_age_s",
]


@dataclass(frozen=True)
class TableStats:
    """The offsets table's row updates (all, heap-only) and its size in bytes (main fork)."""

    updates: int
    hot_updates: int
    dead_rows: int
    size_bytes: int

    @property
    def hot_ratio(self) -> float | None:
        """Heap-only updates / all updates (None before the first update)."""
        return self.hot_updates / self.updates if self.updates else None


def offsets_table_stats(conn: sa.Connection, db: DatabaseSettings) -> TableStats:
    """The offsets table's counters from ``pg_stat_user_tables`` and ``pg_relation_size``."""
    row = conn.execute(
        sa.text(
            "SELECT coalesce(s.n_tup_upd, 0) AS upd, coalesce(s.n_tup_hot_upd, 0) AS hot,"
            " coalesce(s.n_dead_tup, 0) AS dead, pg_relation_size(c.oid) AS size"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE n.nspname = :schema AND c.relname = 'offsets'"
        ),
        {"schema": db.schema},
    ).one_or_none()
    if row is None:
        return TableStats(0, 0, 0, 0)
    return TableStats(int(row.upd), int(row.hot), int(row.dead), int(row.size))


def flush_stats(conn: sa.Connection) -> None:
    """Make this backend's pending statistics visible now (PostgreSQL >= 15; a no-op before)."""
    if conn.dialect.server_version_info and conn.dialect.server_version_info >= (15,):
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))


def oldest_transaction_age_s(conn: sa.Connection) -> float:
    """Seconds since the oldest transaction still open in this database began (0: none but ours).

    A transaction held open (an idle session in a transaction, a long report) keeps every row
    version younger than it: the offsets table's updates stop being pruned and it bloats.
    """
    age = conn.execute(
        sa.text(
            "SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) FROM pg_stat_activity"
            " WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
        )
    ).scalar_one()
    return max(0.0, float(age))


@dataclass(frozen=True)
class ConnectionHeadroom:
    """``max_connections``, the slots reserved for superusers, and the connections open now."""

    max_connections: int
    reserved: int
    in_use: int

    @property
    def free(self) -> int:
        """Connections an ordinary role may still open."""
        return max(0, self.max_connections - self.reserved - self.in_use)


def connection_headroom(conn: sa.Connection) -> ConnectionHeadroom:
    """How many more connections the server accepts from an ordinary role (this one counted as
    in use). ``pg_stat_activity`` lists every client backend of the server, whatever its database."""
    row = conn.execute(
        sa.text(
            "SELECT current_setting('max_connections')::int AS max,"
            " current_setting('superuser_reserved_connections')::int"
            " + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved,"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS in_use"
        )
    ).one()
    return ConnectionHeadroom(int(row.max), int(row.reserved), int(row.in_use))
