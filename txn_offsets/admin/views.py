"""Read-only views of the offset store: stored offsets (``offsets show``), jobs (``jobs list``)
and a job's audit history (``offsets history``). Each reads in one short connection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.store.database import translate_errors
from txn_offsets.store.runs import lock_job, validate_job
from txn_offsets.store.schema import tables_for

__all__ = ["AuditRow", "JobRow", "OffsetRow", "audit_log", "list_jobs", "show_offsets"]


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


def show_offsets(engine: sa.Engine, db: DatabaseSettings, job: str | None = None) -> list[OffsetRow]:
    o = tables_for(db.schema).offsets
    stmt = sa.select(o).order_by(o.c.job, o.c.topic, o.c.part)
    if job is not None:
        stmt = stmt.where(o.c.job == validate_job(job))
    with translate_errors(db), engine.connect() as conn:
        if job is not None:
            lock_job(conn, db, job, for_update=False)  # UnknownJob rather than an empty table
        return [OffsetRow(r.job, r.topic, r.part, r.off, r.updated_at) for r in conn.execute(stmt)]


def list_jobs(engine: sa.Engine, db: DatabaseSettings) -> list[JobRow]:
    t = tables_for(db.schema)
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
        )
        .select_from(j.outerjoin(counts, counts.c.job == j.c.job))
        .order_by(j.c.job)
    )
    with translate_errors(db), engine.connect() as conn:
        return [
            JobRow(r.job, r.generation, r.run_id, bool(r.live), None if r.age is None else float(r.age), r.n)
            for r in conn.execute(stmt)
        ]


def audit_log(engine: sa.Engine, db: DatabaseSettings, job: str, *, limit: int = 50) -> list[AuditRow]:
    """The newest audit rows of `job`, newest first."""
    a = tables_for(db.schema).audit
    stmt = sa.select(a).where(a.c.job == validate_job(job)).order_by(a.c.id.desc()).limit(limit)
    with translate_errors(db), engine.connect() as conn:
        return [
            AuditRow(r.at, r.topic, r.part, r.old_off, r.new_off, r.action, r.reason, r.actor, r.generation)
            for r in conn.execute(stmt)
        ]
