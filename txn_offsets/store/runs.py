"""Runs of a job: the fencing generation and the lease of the live run.

Starting a run bumps the job's generation in the same transaction that takes the lease, so every
older run is fenced from then on: its claims carry the old generation and no longer match.

Why the claim cannot slip past a new run: a claim locks the job row ``FOR KEY SHARE`` until its
transaction ends, and everything that bumps the generation (a new run, an admin reset) first locks
the row ``FOR UPDATE``, which conflicts with it. So the bump waits for claims already in flight,
and claims that start later see the new generation. Heartbeats update only non-key columns, which
does not conflict with ``FOR KEY SHARE``: a heartbeat never waits for a batch commit.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, Fenced, JobAlreadyRunning, ServiceUnavailable, UnknownJob
from txn_offsets.store import roles
from txn_offsets.store.database import sqlstate, translate_errors
from txn_offsets.store.schema import tables_for

__all__ = [
    "JobState",
    "Run",
    "StartTicket",
    "end_run",
    "heartbeat",
    "lock_job",
    "new_run_id",
    "renew_lease",
    "set_lock_timeout",
    "start_run",
    "validate_job",
]

logger = logging.getLogger(__name__)

_MAX_JOB_NAME = 200


def _seconds(value: object) -> sa.ColumnElement[object]:
    """An interval of `value` seconds (a bound value or a column)."""
    return sa.func.make_interval(0, 0, 0, 0, 0, 0, value)


@dataclass(frozen=True)
class Run:
    """One run of a job. Picklable: executors carry it to fence their claims."""

    job: str
    generation: int
    run_id: str


@dataclass(frozen=True)
class JobState:
    """A job row as read under lock, with the lease evaluated by the database clock."""

    job: str
    generation: int
    run_id: str | None
    heartbeat_at: datetime | None
    lease_until: datetime | None
    live: bool
    heartbeat_age_s: float
    first_plan_at: datetime | None = None


def validate_job(job: str) -> str:
    """Job names are free text (they are bound values, never identifiers) but must be sane."""
    if not isinstance(job, str) or not job.strip() or len(job) > _MAX_JOB_NAME or not job.isprintable():
        raise ConfigError("job", f"{job!r}: give a non-empty printable name of at most {_MAX_JOB_NAME} chars")
    return job


def _validate_lease(lease_s: float) -> float:
    if not lease_s > 0:
        raise ConfigError("lease_s", f"must be > 0 seconds, got {lease_s}")
    return float(lease_s)


def lock_job(
    conn: sa.Connection, db: DatabaseSettings, job: str, *, for_update: bool = True, key_share: bool = False
) -> JobState:
    """Read the job row, locked ``FOR UPDATE`` by default (waits for claims in flight).

    With ``for_update=False, key_share=True`` it is locked ``FOR KEY SHARE``, as a claim locks it:
    a generation bump (``FOR UPDATE``) then waits until this transaction ends, so a generation
    checked here stays current for every offset move made in the same transaction.
    """
    jobs = tables_for(db.schema).jobs
    age = sa.func.coalesce(sa.extract("epoch", sa.func.now() - jobs.c.heartbeat_at), 0.0)
    stmt = sa.select(
        jobs.c.job,
        jobs.c.generation,
        jobs.c.run_id,
        jobs.c.heartbeat_at,
        jobs.c.lease_until,
        sa.and_(jobs.c.run_id.is_not(None), jobs.c.lease_until > sa.func.now()).label("live"),
        age.label("age"),
        jobs.c.first_plan_at,
    ).where(jobs.c.job == job)
    if for_update:
        stmt = stmt.with_for_update()
    elif key_share:
        stmt = stmt.with_for_update(read=True, key_share=True)
    row = conn.execute(stmt).one_or_none()
    if row is None:
        roles.require_reachable(conn, db, job)  # hidden by row-level security: say so
        raise UnknownJob(job)
    return JobState(
        row.job,
        row.generation,
        row.run_id,
        row.heartbeat_at,
        row.lease_until,
        bool(row.live),
        float(row.age),
        row.first_plan_at,
    )


_START_ATTEMPTS = 5  # a start whose connection broke is tried again, the same run id each time
_START_BACKOFF_S = 0.5  # times the attempt: 0.5 + 1 + 1.5 + 2 s, about a failover's recovery


class _StartLost(Exception):
    """An attempt's connection broke; `locked` is the generation it bumped if COMMIT was sent."""

    def __init__(self, cause: Exception, locked: int | None) -> None:
        self.cause, self.locked = cause, locked


def start_run(
    engine: sa.Engine,
    db: DatabaseSettings,
    job: str,
    *,
    force: bool = False,
    lease_s: float = 60.0,
    lock_timeout_s: float = 30.0,
    resume: StartTicket | None = None,
) -> Run:
    """Start a run of `job`: bump the generation (fencing older runs) and take the lease.

    Refuses with JobAlreadyRunning while another run's lease is live, unless `force`.

    The run id is the start's token. A connection that breaks during the start (a failover, a lost
    COMMIT) is tried again with the same run id (up to 5 attempts, ~5 s), and the job row, read
    again under lock, says what the lost COMMIT did: our run id -> it committed (this run goes on
    with that generation); the generation it locked -> it did not (start again); anything else ->
    another run took the job meanwhile: Fenced. Never a second bump, never a guess.

    `resume`: the ticket of a start of this job tried before in a joint transaction
    (:mod:`txn_offsets.store.many_runs`) that did not say whether it committed: this start goes
    on with its run id and the generation it locked, exactly as after a lost COMMIT of its own.
    """
    validate_job(job)
    lease = _validate_lease(lease_s)
    if resume is not None and resume.job != job:
        raise ConfigError("resume", f"the ticket is job {resume.job!r}'s, not {job!r}'s")
    run_id = resume.run_id if resume is not None else new_run_id()
    lost = resume.locked if resume is not None else None  # the generation a lost COMMIT of ours bumped
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            return _start(
                engine, db, job, run_id=run_id, force=force, lease=lease, lock_timeout_s=lock_timeout_s,
                lost=lost, retry=attempt > 1,
            )  # fmt: skip
        except _StartLost as exc:
            if attempt == _START_ATTEMPTS:
                raise exc.cause from None
            lost = exc.locked if exc.locked is not None else lost
            logger.warning("job %r: connection lost while starting run %r; trying again", job, run_id)
            time.sleep(_START_BACKOFF_S * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _start(
    engine: sa.Engine,
    db: DatabaseSettings,
    job: str,
    *,
    run_id: str,
    force: bool,
    lease: float,
    lock_timeout_s: float,
    lost: int | None,
    retry: bool,
) -> Run:
    """One attempt of :func:`start_run`; a broken connection is _StartLost (a first attempt that
    cannot connect at all is the caller's ServiceUnavailable, as before)."""
    ticket = StartTicket(job, run_id, lost)
    connected = False
    try:
        with translate_errors(db), engine.connect() as conn, conn.begin():
            connected = True
            set_lock_timeout(conn, lock_timeout_s)
            # row-level security would refuse the insert in _start_in with a bare policy violation
            roles.require_reachable(conn, db, job)
            run = _start_in(conn, db, ticket, force=force, lease=lease)
    except ServiceUnavailable as exc:
        if retry or connected:  # the connection broke mid-start (or the database is still away)
            raise _StartLost(exc, ticket.locked) from None
        raise
    logger.info("job %r: started run %r, generation %r", job, run_id, run.generation)
    return run


@dataclass
class StartTicket:
    """A start's identity: the run id it starts, and (once its UPDATE ran) the generation it
    locked. After a start whose COMMIT may have been lost, the ticket says what to look for."""

    job: str
    run_id: str
    locked: int | None = None


def new_run_id() -> str:
    """A run id: host, process and 12 random hex digits."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def set_lock_timeout(conn: sa.Connection, lock_timeout_s: float) -> None:
    """The start's lock_timeout, for the rest of `conn`'s transaction: a claim stuck in flight must
    not hang a start forever (a bound value: no SQL built here)."""
    conn.execute(
        sa.text("SELECT set_config('lock_timeout', :v, true)"), {"v": f"{int(lock_timeout_s * 1000)}ms"}
    )


def _start_in(
    conn: sa.Connection, db: DatabaseSettings, ticket: StartTicket, *, force: bool, lease: float
) -> Run:
    """The start's statements in `conn`'s transaction (the role check done): the job row made if
    new and locked, the generation bumped and the lease taken for ``ticket.run_id``; the ticket
    records the generation it locked. Leaving the transaction commits the start."""
    jobs = tables_for(db.schema).jobs
    job, run_id, lost = ticket.job, ticket.run_id, ticket.locked
    conn.execute(pg_insert(jobs).values(job=job).on_conflict_do_nothing())
    state = _lock_for_start(conn, db, job)
    if state.run_id == run_id:  # our lost COMMIT was applied: this run goes on
        logger.warning("job %r: the lost start of run %r had committed", job, run_id)
        return Run(job, state.generation, run_id)
    if lost is not None and state.generation != lost:
        raise Fenced(job, lost + 1, state.generation)  # another run started meanwhile
    if state.live and not force:
        raise JobAlreadyRunning(job, state.run_id or "?", state.generation, state.heartbeat_age_s)
    if state.live:
        logger.warning(
            "job %r: forcing a new run, fencing live run %r (generation %r)",
            job,
            state.run_id,
            state.generation,
        )
    generation = conn.execute(
        sa.update(jobs)
        .where(jobs.c.job == job)
        .values(
            generation=jobs.c.generation + 1,
            run_id=run_id,
            run_host=socket.gethostname(),
            lease_s=lease,
            started_at=sa.func.now(),
            heartbeat_at=sa.func.now(),
            lease_until=sa.func.now() + _seconds(lease),
        )
        .returning(jobs.c.generation)
    ).scalar_one()
    ticket.locked = state.generation  # the caller's COMMIT (or its loss) decides the rest
    return Run(job, generation, run_id)


def _lock_for_start(conn: sa.Connection, db: DatabaseSettings, job: str) -> JobState:
    """The job row FOR UPDATE; a batch of the current run still committing past the start's
    lock_timeout is JobAlreadyRunning."""
    try:
        with conn.begin_nested():
            return lock_job(conn, db, job)
    except sa.exc.OperationalError as exc:
        if sqlstate(exc) != "55P03":  # lock_not_available
            raise
        state = lock_job(conn, db, job, for_update=False)
        raise JobAlreadyRunning(
            job, state.run_id or "(a transaction in flight)", state.generation, state.heartbeat_age_s
        ) from None


def renew_lease(conn: sa.Connection, db: DatabaseSettings, run: Run) -> JobState:
    """Extend the lease of `run` in the caller's transaction and return the job row; raises Fenced
    if a newer run (or a reset) took the job.

    One statement: the generation is checked by the same UPDATE that renews the lease, and the row
    stays locked (FOR NO KEY UPDATE) until the transaction ends, so a new run's bump (FOR UPDATE)
    waits for it; claims (FOR KEY SHARE) do not. Offsets moved later in the same transaction are
    therefore moved by the current run or not at all, as with ``offset_rows.check_generation``.
    """
    jobs = tables_for(db.schema).jobs
    row = conn.execute(
        sa.update(jobs)
        .where(jobs.c.job == run.job, jobs.c.generation == run.generation, jobs.c.run_id == run.run_id)
        .values(
            heartbeat_at=sa.func.now(),
            lease_until=sa.func.now() + _seconds(sa.func.coalesce(jobs.c.lease_s, 60.0)),
        )
        .returning(jobs.c.heartbeat_at, jobs.c.lease_until, jobs.c.first_plan_at)
    ).one_or_none()
    if row is None:
        state = lock_job(conn, db, run.job, for_update=False)
        raise Fenced(run.job, run.generation, state.generation)
    return JobState(
        run.job, run.generation, run.run_id, row.heartbeat_at, row.lease_until, True, 0.0, row.first_plan_at
    )


def heartbeat(engine: sa.Engine, db: DatabaseSettings, run: Run) -> None:
    """Extend the lease of `run`; raises Fenced if a newer run (or a reset) took the job."""
    with translate_errors(db), engine.begin() as conn:
        renew_lease(conn, db, run)


def end_run(engine: sa.Engine, db: DatabaseSettings, run: Run) -> bool:
    """Release the lease if `run` still holds it; returns whether it did (False: fenced meanwhile)."""
    jobs = tables_for(db.schema).jobs
    with translate_errors(db), engine.begin() as conn:
        released = conn.execute(
            sa.update(jobs)
            .where(jobs.c.job == run.job, jobs.c.generation == run.generation, jobs.c.run_id == run.run_id)
            .values(run_id=None, lease_until=None)
        ).rowcount
    if released != 1:
        logger.info("job %r: run %r no longer held the lease at its end", run.job, run.run_id)
    return released == 1
