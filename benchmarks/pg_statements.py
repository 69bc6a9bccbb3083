"""PostgreSQL's time by kind of statement, from its ``pg_stat_statements`` (the local stack loads it:
txn_offsets/devstack/postgres.py).

:func:`snapshot` reads each normalised statement's total time (execution, and planning when
``pg_stat_statements.track_planning`` is on) in this database and sums it by :func:`kind`: the
guarded claim, a job's writes (the staging table, its COPY and the merge), COMMIT, the run's own
bookkeeping (lease, stats) and the rest. Two snapshots around a run, divided by its batches, say
where PostgreSQL's time goes in a batch (benchmarks/user_scale.py prints it beside each process's
CPU). Times are the server's wall time inside each statement (lock waits included), not CPU. The
view holds every role's statements; a role that is not the one running them (nor a member of
``pg_read_all_stats``) sees their times but not their text, which count as "other".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import sqlalchemy as sa

__all__ = ["KINDS", "kind", "snapshot", "used"]

#: the kinds, first match wins (a job's own upsert is an INSERT ... ON CONFLICT as the stats are)
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("claim", re.compile(r"^\s*WITH want AS\b")),
    ("lease", re.compile(r"^\s*WITH renewed AS\b")),
    ("stats", re.compile(r"^\s*INSERT INTO \S*job_stats\b")),
    ("write: staging", re.compile(r"^\s*CREATE TEMP TABLE\b")),
    ("write: copy", re.compile(r"^\s*COPY pg_temp\.")),
    ("write: merge", re.compile(r"^\s*INSERT INTO\b.*\bON CONFLICT\b", re.DOTALL)),
    ("commit", re.compile(r"^\s*COMMIT\b")),
)

_QUERY = sa.text(
    "SELECT query, total_exec_time + total_plan_time FROM pg_stat_statements "
    "WHERE dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"
)


def kind(query: str | None) -> str:
    """The kind of a statement's text (None: a text this role may not see)."""
    if query is not None:
        for name, pattern in KINDS:
            if pattern.match(query):
                return name
    return "other"


def snapshot(engine: sa.Engine) -> dict[str, float] | None:
    """Each kind's total time so far in ms, or None when the view cannot be read (the extension
    not loaded or not created in this database)."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(_QUERY).all()
    except sa.exc.DBAPIError:
        return None
    out: dict[str, float] = {}
    for query, ms in rows:
        name = kind(query)
        out[name] = out.get(name, 0.0) + float(ms)
    return out


def used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each kind's time between two snapshots (a kind whose statements were evicted: 0, not below)."""
    return {name: max(0.0, ms - before.get(name, 0.0)) for name, ms in after.items()}
