"""Read-only views of a job for the operator's console (``serve``'s /console pages): the jobs'
leases and last commits, a page of stored offsets, the runs seen in the lineage and how each
ended, and the dead letters' counts and offsets (never their payloads).

Each reads in one short connection, as :mod:`txn_offsets.admin.views` does; the audit history and
the lineage search are :func:`~txn_offsets.admin.views.audit_log` and
:func:`~txn_offsets.admin.lineage.explain` themselves (what the CLI shows). A job named that has no
row is :class:`~txn_offsets.errors.UnknownJob`.

**How a run ended** is the run's row of ``job_runs`` (migration 0013: finished, failed with its
error's class and cause, fenced by a newer run or an admin move - the audit rows of that
generation name the move, its actor and reason -, its holder's process gone, its lease expired).
A run still holding its job has no end yet: the job row says whether its lease is live. A run the
table does not know (one that started before 0013, or pruned from it) is told from what else the
store keeps: every new run or admin move takes the next generation, so such a run ended before
that move or was fenced by it, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from txn_offsets.admin.views import is_retired
from txn_offsets.errors import ConfigError
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, validate_job

__all__ = [
    "DeadLetterGroup",
    "JobLease",
    "OffsetPage",
    "PartitionRow",
    "RunRow",
    "dead_letter_groups",
    "job_leases",
    "offset_page",
    "runs_of",
]


@dataclass(frozen=True)
class JobLease:
    """A job's row: its generation, the run holding (or last holding) the lease, where it runs."""

    job: str
    generation: int
    run_id: str | None
    run_host: str | None
    live: bool
    started_at: datetime | None
    lease_until: datetime | None
    last_commit_at: datetime | None  # the newest commit row kept (None: none, or all pruned)
    retired_at: datetime | None
    partitions: int | None  # stored offsets (None: not counted)


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    offset: int
    updated_at: datetime
    topic_id: str | None  # the topic incarnation the offset belongs to


@dataclass(frozen=True)
class OffsetPage:
    rows: tuple[PartitionRow, ...]
    total: int  # the job's stored partitions


@dataclass(frozen=True)
class RunRow:
    run_id: str
    generation: int
    first_commit_at: datetime | None
    last_commit_at: datetime | None
    commits: int
    offsets: int  # offsets covered by its commit rows kept
    ended: str  # how it ended, as far as the store tells (see the module)


@dataclass(frozen=True)
class DeadLetterGroup:
    """The dead letters of one partition: how many, their offsets' span and the newest one."""

    topic: str
    partition: int
    count: int
    first_offset: int
    last_offset: int
    newest_at: datetime


def _check_page(offset: int, limit: int) -> None:
    for name, value, low in (("offset", offset, 0), ("limit", limit, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(name, f"{value!r}: give a whole number >= {low}")


def job_leases(store: Store, job: str | None = None, *, count: bool = True) -> list[JobLease]:
    """Every job (the retired ones too), by name; or `job` alone (UnknownJob if it has no row).
    `count`: with the number of its stored offsets (an index scan of each job's rows)."""
    t = store.tables
    j, c, o = t.jobs, t.commits, t.offsets
    last = sa.select(sa.func.max(c.c.committed_at)).where(c.c.job == j.c.job).scalar_subquery()
    counted = sa.select(sa.func.count()).select_from(o).where(o.c.job == j.c.job).scalar_subquery()
    stmt = sa.select(
        j.c.job,
        j.c.generation,
        j.c.run_id,
        j.c.run_host,
        sa.and_(j.c.run_id.is_not(None), j.c.lease_until > sa.func.now()).label("live"),
        j.c.started_at,
        j.c.lease_until,
        last.label("last_commit_at"),
        sa.case((is_retired(j), j.c.retired_at), else_=None).label("retired_at"),
        (counted if count else sa.null()).label("partitions"),
    ).order_by(j.c.job)
    if job is not None:
        stmt = stmt.where(j.c.job == validate_job(job))
    with store.connect() as conn:
        if job is not None:
            lock_job(conn, store.settings, job, for_update=False)
        return [
            JobLease(
                r.job,
                r.generation,
                r.run_id,
                r.run_host,
                bool(r.live),
                r.started_at,
                r.lease_until,
                r.last_commit_at,
                r.retired_at,
                r.partitions,
            )
            for r in conn.execute(stmt)
        ]


def offset_page(store: Store, job: str, *, offset: int = 0, limit: int = 100) -> OffsetPage:
    """`limit` stored offsets of `job` from the `offset`-th, by topic and partition."""
    _check_page(offset, limit)
    o = store.tables.offsets
    mine = o.c.job == validate_job(job)
    page = (
        sa.select(o.c.topic, o.c.part, o.c.off, o.c.updated_at, o.c.topic_id)
        .where(mine)
        .order_by(o.c.topic, o.c.part)
        .offset(offset)
        .limit(limit)
    )
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        total = conn.execute(sa.select(sa.func.count()).select_from(o).where(mine)).scalar_one()
        rows = tuple(
            PartitionRow(r.topic, r.part, r.off, r.updated_at, r.topic_id) for r in conn.execute(page)
        )
    return OffsetPage(rows, total)


def runs_of(store: Store, job: str, *, limit: int = 50) -> list[RunRow]:
    """The newest `limit` runs of `job`, newest generation first: those of ``job_runs`` and those with
    commit rows kept, each with how it ended (see the module)."""
    _check_page(0, limit)
    t = store.tables
    c, a, j, r = t.commits, t.audit, t.jobs, t.runs
    committed = (
        sa.select(
            c.c.run_id,
            sa.func.max(c.c.generation).label("generation"),
            sa.func.min(c.c.committed_at).label("first"),
            sa.func.max(c.c.committed_at).label("last"),
            sa.func.count().label("commits"),
            sa.func.sum(c.c.until_off - c.c.from_off).label("offsets"),
        )
        .where(c.c.job == validate_job(job))
        .group_by(c.c.run_id)
        .order_by(sa.literal_column("generation").desc())
        .limit(limit)
    )
    recorded = sa.select(r).where(r.c.job == job).order_by(r.c.generation.desc()).limit(limit)
    moves = (
        sa.select(a.c.generation, a.c.action, a.c.actor, a.c.reason, sa.func.min(a.c.at).label("at"))
        .where(a.c.job == job, a.c.generation.is_not(None))
        .group_by(a.c.generation, a.c.action, a.c.actor, a.c.reason)
    )
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        row = conn.execute(
            sa.select(
                j.c.generation,
                j.c.run_id,
                j.c.started_at,
                sa.and_(j.c.run_id.is_not(None), j.c.lease_until > sa.func.now()).label("live"),
            ).where(j.c.job == job)
        ).one()
        found = {x.run_id: x for x in conn.execute(committed)}
        ends = {x.run_id: x for x in conn.execute(recorded)}
        audited = list(conn.execute(moves))
    # generation -> what took it: a run (its id) or an audited move (action by actor: reason); an
    # import's rows carry the generation it found, and it took the next one (store.fences)
    took: dict[int, str] = {}
    for m in audited:
        took[int(m.generation) + (1 if m.action == "import" else 0)] = f"{m.action} by {m.actor}: {m.reason}"
    took.update({int(x.generation): f"run {x.run_id}" for x in found.values()})
    took.update({int(x.generation): f"run {x.run_id}" for x in ends.values()})
    if row.run_id is not None:
        took[int(row.generation)] = f"run {row.run_id}"
    out = []
    for run_id in found.keys() | ends.keys() | ({row.run_id} - {None}):
        kept, ended = found.get(run_id), ends.get(run_id)
        generation = int(
            kept.generation if kept is not None else ended.generation if ended is not None else row.generation
        )
        run = RunRow(
            run_id,
            generation,
            None if kept is None else kept.first,
            None if kept is None else kept.last,
            0 if kept is None else int(kept.commits),
            0 if kept is None else int(kept.offsets or 0),
            "",
        )
        out.append(_with_end(run, row, ended, took))
    return sorted(out, key=lambda x: x.generation, reverse=True)[:limit]


def _with_end(
    run: RunRow,
    job: sa.Row[tuple[object, ...]],
    ended: sa.Row[tuple[object, ...]] | None,
    took: dict[int, str],
) -> RunRow:
    if ended is not None and ended.ended is not None:
        how = _recorded_end(ended, took)
    elif run.run_id == job.run_id and run.generation == job.generation:
        how = "running (lease live)" if job.live else "lease ran out (the driver stopped without ending it)"
    elif ended is not None:  # recorded at its start, its end not (a move outside the trigger's view)
        how = "ended (not recorded)"
    elif run.generation == job.generation and job.run_id is None:
        how = "ended (lease released)"
    else:
        later = sorted(g for g in took if g > run.generation)
        how = (
            f"ended before, or fenced by, generation {later[0]} ({took[later[0]]}) (not recorded)"
            if later
            else "ended (lease released)"
        )
    return RunRow(
        run.run_id, run.generation, run.first_commit_at, run.last_commit_at, run.commits, run.offsets, how
    )


def _recorded_end(ended: Any, took: dict[int, str]) -> str:
    """A `job_runs` row's end as the page says it."""
    by = ended.ended_by_generation
    after = "" if by is None else f"generation {by} ({took.get(int(by), 'an admin move')})"
    if ended.ended_by_run is not None:
        after = f"generation {by} (run {ended.ended_by_run})"
    if ended.ended == "finished":
        return "finished (lease released)"
    if ended.ended == "failed":
        return f"failed: {ended.error_class}" + (f": {ended.cause}" if ended.cause else "")
    if ended.ended == "fenced":
        return f"fenced by {after}"
    if ended.ended == "holder_gone":
        return f"its process was gone (killed or crashed): taken over by {after}"
    return f"lease expired (the driver stopped without ending it); then {after}"


def dead_letter_groups(store: Store, job: str, *, limit: int = 100) -> tuple[list[DeadLetterGroup], int]:
    """Per partition (at most `limit`), the dead letters of `job`; and their count over all
    partitions. Reads no key, value or error text: offsets and times only."""
    _check_page(0, limit)
    d = store.tables.dead_letters
    mine = d.c.job == validate_job(job)
    stmt = (
        sa.select(
            d.c.topic,
            d.c.part,
            sa.func.count().label("n"),
            sa.func.min(d.c.off).label("lo"),
            sa.func.max(d.c.off).label("hi"),
            sa.func.max(d.c.at).label("newest"),
        )
        .where(mine)
        .group_by(d.c.topic, d.c.part)
        .order_by(d.c.topic, d.c.part)
        .limit(limit)
    )
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        total = conn.execute(sa.select(sa.func.count()).select_from(d).where(mine)).scalar_one()
        groups = [DeadLetterGroup(r.topic, r.part, r.n, r.lo, r.hi, r.newest) for r in conn.execute(stmt)]
    return groups, int(total)
