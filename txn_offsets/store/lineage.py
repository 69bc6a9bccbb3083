"""The lineage of every commit: one ``commits`` row per range a guarded claim committed.

:func:`record` is called by :func:`txn_offsets.store.transaction.commit_ranges` after every claim
of the transaction succeeded, before the user's write: one multi-row INSERT for the batch's ranges,
in the same transaction, so a rolled-back attempt leaves no row, an attempt that finds its ranges
already committed adds none, and a committed range has exactly one. ``guard=False`` (benchmarks)
claims nothing and records nothing.

Retention is by age (``DatabaseSettings.lineage_retention_days``): the planner calls
:func:`prune_due` in its transaction, which deletes at most ``max_rows`` of the job's oldest
expired rows, at most once per :data:`PRUNE_EVERY_S` per job and process - or again at the next
plan when the last prune was full, so a backlog is worked off in bounded steps.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange, TopicPartition
from txn_offsets.store.runs import Run
from txn_offsets.store.schema import tables_for

__all__ = ["PRUNE_EVERY_S", "PRUNE_MAX_ROWS", "Lineage", "forget_prunes", "prune", "prune_due", "record"]

#: A job's lineage is pruned at most this often per process (unless the last prune was full).
PRUNE_EVERY_S = 600.0
#: At most this many rows per prune: the planner's transaction stays short.
PRUNE_MAX_ROWS = 5000

_TS = sa.DateTime(timezone=True)
_pruned: dict[tuple[str, str], float] = {}  # (schema, job) -> monotonic time of the last prune
_lock = threading.Lock()


@dataclass(frozen=True)
class Lineage:
    """What the committer knows beyond the ranges: the batch number and, per partition, the first
    and last record timestamps (ms since the epoch; None: unknown, or the range had no record)."""

    batch: int | None = None
    timestamps: Mapping[TopicPartition, tuple[int | None, int | None]] = field(default_factory=dict)


def _at(ms: int | None) -> datetime | None:
    # Kafka's "no timestamp" is -1 (None from the reader); anything else is ms since the epoch
    return None if ms is None or ms < 0 else datetime.fromtimestamp(ms / 1000, tz=UTC)


def record(
    conn: sa.Connection,
    db: DatabaseSettings,
    run: Run,
    ranges: Sequence[OffsetRange],
    lineage: Lineage | None = None,
) -> None:
    """Insert one row per range (one statement), in the caller's transaction."""
    lin = lineage or Lineage()
    params: dict[str, object] = {"job": run.job, "generation": run.generation, "run_id": run.run_id}
    params["batch"] = lin.batch
    for i, r in enumerate(ranges):
        first, last = lin.timestamps.get(r.key, (None, None))
        params.update(
            {f"t{i}": r.topic, f"p{i}": r.partition, f"f{i}": r.start, f"u{i}": r.until}
            | {f"a{i}": _at(first), f"z{i}": _at(last)}
        )
    conn.execute(_insert(db.schema, len(ranges)), params)


@functools.lru_cache(maxsize=256)
def _insert(schema: str, n: int) -> sa.TextClause:
    """The INSERT of `n` rows as text, built once per schema and size: a Core insert() is compiled,
    or at least cache-keyed, on every call, which cost as much as the statement itself (+0.2-0.3 ms
    per single-range commit, measured). The schema is a validated identifier (tables_for)."""
    table = tables_for(schema).commits
    values = ", ".join(
        f"(:job, :t{i}, :p{i}, :f{i}, :u{i}, :generation, :run_id, :batch, :a{i}, :z{i})" for i in range(n)
    )
    columns = (
        "job, topic, part, from_off, until_off, generation, run_id, batch, first_record_at, last_record_at"
    )
    sql = f'INSERT INTO "{table.schema}".{table.name} ({columns}) VALUES {values}'  # noqa: S608 - no value
    return sa.text(sql).bindparams(
        sa.bindparam("batch", type_=sa.BigInteger),
        *[sa.bindparam(f"{k}{i}", type_=_TS) for i in range(n) for k in "az"],
    )


def prune(conn: sa.Connection, db: DatabaseSettings, job: str, *, max_rows: int = PRUNE_MAX_ROWS) -> int:
    """Delete at most `max_rows` of `job`'s rows older than the retention, oldest first; returns
    how many. (No ``FOR UPDATE SKIP LOCKED``: it would need UPDATE, and one run prunes a job.)"""
    c = tables_for(db.schema).commits
    cutoff = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, db.lineage_retention_days * 86400.0)
    old = (
        sa.select(c.c.id)
        .where(c.c.job == job, c.c.committed_at < cutoff)
        .order_by(c.c.committed_at)
        .limit(max_rows)
    )
    result = conn.execute(sa.delete(c).where(c.c.id.in_(old)))
    return int(result.rowcount)


def prune_due(
    conn: sa.Connection, db: DatabaseSettings, job: str, *, max_rows: int = PRUNE_MAX_ROWS
) -> int | None:
    """:func:`prune` if it is due for `job` in this process (None: not due)."""
    key = (db.schema, job)
    now = time.monotonic()
    with _lock:
        last = _pruned.get(key)
        if last is not None and now - last < PRUNE_EVERY_S:
            return None
        _pruned[key] = now
    deleted = prune(conn, db, job, max_rows=max_rows)
    if deleted >= max_rows:
        with _lock:
            _pruned.pop(key, None)  # a backlog: prune again at the next plan
    return deleted


def forget_prunes() -> None:
    """Forget when each job was last pruned (tests)."""
    with _lock:
        _pruned.clear()
