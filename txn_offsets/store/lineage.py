"""The lineage of every commit: one ``commits`` row per range a guarded claim committed.

The rows are inserted by the claim itself (:func:`txn_offsets.commit.claim.claim_ranges`, one
statement for a transaction's ranges), and only when every range of the transaction was claimed:
a rolled-back attempt leaves no row, an attempt that finds its ranges already committed adds none,
and a committed range has exactly one (the benchmarks' at-least-once contender, which claims
nothing, records nothing). This module holds what the rows carry (:class:`Lineage`) and their retention.

Retention is by age (``DatabaseSettings.lineage_retention_days``): the planner calls
:func:`prune_due` in its transaction, which deletes at most ``max_rows`` of the job's oldest
expired rows, at most once per :data:`PRUNE_EVERY_S` per job and process - or again at the next
plan when the last prune was full, so a backlog is worked off in bounded steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.schema import tables_for

__all__ = [
    "PRUNE_EVERY_S",
    "PRUNE_MAX_ROWS",
    "Lineage",
    "forget_prunes",
    "known_ms",
    "prune",
    "prune_due",
    "prune_is_due",
]

#: A job's lineage is pruned at most this often per process (unless the last prune was full).
PRUNE_EVERY_S = 600.0
#: At most this many rows per prune: the planner's transaction stays short.
PRUNE_MAX_ROWS = 5000

_pruned: dict[tuple[str, str], float] = {}  # (schema, job) -> monotonic time of the last prune
_lock = threading.Lock()


@dataclass(frozen=True)
class Lineage:
    """What the committer knows beyond the ranges: the batch number and, per partition, the first
    and last record timestamps (ms since the epoch; None: unknown, or the range had no record)."""

    batch: int | None = None
    timestamps: Mapping[TopicPartition, tuple[int | None, int | None]] = field(default_factory=dict)


def known_ms(ms: int | None) -> int | None:
    """A record timestamp in ms since the epoch, None when unknown (the claim makes it the
    ``commits`` row's timestamptz)."""
    # Kafka's "no timestamp" is -1 (None from the reader); anything else is ms since the epoch
    return None if ms is None or ms < 0 else ms


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


def prune_is_due(db: DatabaseSettings, job: str) -> bool:
    """Whether :func:`prune_due` would prune `job` now (it changes nothing)."""
    with _lock:
        last = _pruned.get((db.schema, job))
    return last is None or time.monotonic() - last >= PRUNE_EVERY_S


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
