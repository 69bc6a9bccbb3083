"""Read-only views of the offset store: stored offsets (``offsets show``), jobs (``jobs list``)
and a job's audit history (``offsets history``). Each reads in one short connection; a job named
that has no row is :class:`~txn_offsets.errors.UnknownJob`, never an empty answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from txn_offsets.errors import ConfigError
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, validate_job

__all__ = ["AuditRow", "JobRow", "OffsetRow", "audit_log", "is_retired", "list_jobs", "show_offsets"]


@dataclass(frozen=True)
class OffsetRow:
    job: str
    topic: str
    partition: int
    offset: int
    updated_at: datetime


@dataclass(frozen=True)
class JobRow:
    job: str
    generation: int
    run_id: str | None
    live: bool
    heartbeat_age_s: float | None
    partitions: int
    #: when `jobs retire` retired it (None: in service); a run started since brings it back
    retired_at: datetime | None = None

    @property
    def state(self) -> str:
        return "retired" if self.retired_at is not None else "live" if self.live else "idle"


@dataclass(frozen=True)
class AuditRow:
    at: datetime
    topic: str
    partition: int
    old: int | None
    new: int
    action: str
    reason: str
    actor: str
    generation: int | None


def show_offsets(store: Store, job: str | None = None) -> list[OffsetRow]:
    o = store.tables.offsets
    stmt = sa.select(o).order_by(o.c.job, o.c.topic, o.c.part)
    if job is not None:
        stmt = stmt.where(o.c.job == validate_job(job))
    with store.connect() as conn:
        if job is not None:
            lock_job(conn, store.settings, job, for_update=False)  # UnknownJob rather than an empty table
        return [OffsetRow(r.job, r.topic, r.part, r.off, r.updated_at) for r in conn.execute(stmt)]


def is_retired(jobs: sa.Table) -> sa.ColumnElement[bool]:
    """Retired by `jobs retire` and not started since (a new run brings a job back)."""
    return sa.and_(
        jobs.c.retired_at.is_not(None),
        sa.or_(jobs.c.started_at.is_(None), jobs.c.started_at < jobs.c.retired_at),
    )


def list_jobs(store: Store, *, include_retired: bool = True) -> list[JobRow]:
    """Every job (`include_retired=False`: those in service only)."""
    t = store.tables
    j = t.jobs
    counts = (
        sa.select(t.offsets.c.job, sa.func.count().label("n")).group_by(t.offsets.c.job).subquery("counts")
    )
    stmt = (
        sa.select(
            j.c.job,
            j.c.generation,
            j.c.run_id,
            sa.and_(j.c.run_id.is_not(None), j.c.lease_until > sa.func.now()).label("live"),
            sa.extract("epoch", sa.func.now() - j.c.heartbeat_at).label("age"),
            sa.func.coalesce(counts.c.n, 0).label("n"),
            sa.case((is_retired(j), j.c.retired_at), else_=None).label("retired_at"),
        )
        .select_from(j.outerjoin(counts, counts.c.job == j.c.job))
        .order_by(j.c.job)
    )
    if not include_retired:
        stmt = stmt.where(sa.not_(is_retired(j)))
    with store.connect() as conn:
        return [
            JobRow(
                r.job,
                r.generation,
                r.run_id,
                bool(r.live),
                None if r.age is None else float(r.age),
                r.n,
                r.retired_at,
            )
            for r in conn.execute(stmt)
        ]


def audit_log(store: Store, job: str, *, limit: int = 50) -> list[AuditRow]:
    """The newest audit rows of `job`, newest first (UnknownJob if it has no row)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError("limit", f"{limit!r}: give a whole number >= 1")
    a = store.tables.audit
    stmt = sa.select(a).where(a.c.job == validate_job(job)).order_by(a.c.id.desc()).limit(limit)
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        return [
            AuditRow(r.at, r.topic, r.part, r.old_off, r.new_off, r.action, r.reason, r.actor, r.generation)
            for r in conn.execute(stmt)
        ]
