"""``jobs retire``: take a job out of service, audited, in one transaction.

Under the job row's lock (``FOR UPDATE``: claims in flight finish first) the retire refuses a live
run unless ``force``, writes one ``retire`` audit row per offset row (its position when retired),
bumps the generation and releases the lease (a forced-out run is fenced: its claims fail from then
on) and sets ``jobs.retired_at``. By default the rows stay: ``jobs list`` hides the job unless
``--all``, and a new run of the job brings it back from its offsets. ``drop_rows`` also deletes the
job's offsets, statistics, stream plan and lineage (``commits``) and forgets its first plan, so a
later run of the same name starts as a new job (its start policy); the job row itself stays, keeping
the generation, so
no later run can reuse a generation an old run was fenced at. The audit rows and dead letters
(records the job rejected) are kept either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from txn_offsets.admin.views import is_retired
from txn_offsets.errors import ConfigError
from txn_offsets.store.audit import OffsetChange, check_audit, default_actor, write_audit
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import already_running, lock_job, validate_job

__all__ = ["Retired", "retire_job"]


@dataclass(frozen=True)
class Retired:
    """What a retire did."""

    job: str
    generation: int
    retired_at: datetime
    partitions: int
    dropped: bool
    fenced_run: str | None
    dead_letters: int


def retire_job(
    store: Store,
    job: str,
    *,
    reason: str,
    actor: str | None = None,
    force: bool = False,
    drop_rows: bool = False,
) -> Retired:
    """Retire `job` (see the module's docstring); UnknownJob, JobAlreadyRunning (a live run and no
    `force`) or ConfigError (no reason; already retired with nothing left to drop) change nothing."""
    validate_job(job)
    who = actor or default_actor()
    check_audit("retire", reason, who)
    t = store.tables
    j, o = t.jobs, t.offsets
    with store.begin() as conn:
        state = lock_job(conn, store.settings, job)
        if state.live and not force:
            raise already_running(state)
        rows = conn.execute(
            sa.select(o.c.topic, o.c.part, o.c.off).where(o.c.job == job).order_by(o.c.topic, o.c.part)
        ).all()
        was = conn.execute(sa.select(j.c.retired_at).where(j.c.job == job, is_retired(j))).scalar()
        if was is not None and not (drop_rows and rows):
            more = "; --drop-rows deletes its offsets" if rows else ""
            raise ConfigError("--job", f"job {job!r} is already retired (at {was.isoformat()}){more}")
        values: dict[str, object] = {
            "generation": j.c.generation + 1,
            "run_id": None,
            "lease_until": None,
            "retired_at": sa.func.now(),
        }
        if drop_rows:
            values["first_plan_at"] = None
        generation, retired_at = conn.execute(
            sa.update(j).where(j.c.job == job).values(values).returning(j.c.generation, j.c.retired_at)
        ).one()
        changes = [OffsetChange(r.topic, r.part, r.off, r.off) for r in rows]
        write_audit(
            conn,
            store.settings,
            job,
            changes,
            action="retire",
            reason=reason,
            actor=who,
            generation=generation,
        )
        if drop_rows:
            for table in (t.stream_plans, o, t.stats, t.commits):
                conn.execute(sa.delete(table).where(table.c.job == job))
        dead = conn.execute(
            sa.select(sa.func.count()).select_from(t.dead_letters).where(t.dead_letters.c.job == job)
        ).scalar_one()
    return Retired(
        job,
        generation,
        retired_at,
        len(rows),
        drop_rows,
        state.run_id if state.live else None,
        int(dead),
    )
