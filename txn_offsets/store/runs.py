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

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, Fenced, JobAlreadyRunning, UnknownJob
from txn_offsets.store import roles
from txn_offsets.store.database import sqlstate, translate_errors
from txn_offsets.store.schema import tables_for

__all__ = [
    "JobState",
    "LeaseKeeper",
    "Run",
    "end_run",
    "heartbeat",
    "keep_lease",
    "lock_job",
    "renew_lease",
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


def start_run(
    engine: sa.Engine,
    db: DatabaseSettings,
    job: str,
    *,
    force: bool = False,
    lease_s: float = 60.0,
    lock_timeout_s: float = 30.0,
) -> Run:
    """Start a run of `job`: bump the generation (fencing older runs) and take the lease.

    Refuses with JobAlreadyRunning while another run's lease is live, unless `force`.
    """
    validate_job(job)
    lease = _validate_lease(lease_s)
    jobs = tables_for(db.schema).jobs
    run_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    with translate_errors(db), engine.begin() as conn:
        # a claim stuck in flight must not hang the start forever (bound value: no SQL built here)
        conn.execute(
            sa.text("SELECT set_config('lock_timeout', :v, true)"), {"v": f"{int(lock_timeout_s * 1000)}ms"}
        )
        # row-level security would refuse the insert below with a bare policy violation
        roles.require_reachable(conn, db, job)
        ins = pg_insert(jobs).values(job=job).on_conflict_do_nothing()
        conn.execute(ins)
        try:
            with conn.begin_nested():
                state = lock_job(conn, db, job)
        except sa.exc.OperationalError as exc:
            if sqlstate(exc) != "55P03":  # lock_not_available
                raise
            # a batch of the current run is committing and did not finish in time
            state = lock_job(conn, db, job, for_update=False)
            raise JobAlreadyRunning(
                job, state.run_id or "(a transaction in flight)", state.generation, state.heartbeat_age_s
            ) from None
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
    logger.info("job %r: started run %r, generation %r", job, run_id, generation)
    return Run(job, generation, run_id)


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


@contextlib.contextmanager
def keep_lease(
    engine: sa.Engine, db: DatabaseSettings, run: Run, *, every_s: float, for_s: float | None = None
) -> Iterator[None]:
    """Renew the lease from a background thread while a batch runs, so a batch longer than the
    lease does not let a second run start without ``force``. A failed renewal is only logged:
    if the run was fenced, its claims fail with Fenced anyway and nothing is written.

    With `for_s` (the batch's timeout) renewals stop after that long: a batch that no longer makes
    progress must not hold the job forever."""
    keeper = LeaseKeeper(engine, db, run, every_s=every_s)
    try:
        with keeper.during(for_s):
            yield
    finally:
        keeper.close()


class LeaseKeeper:
    """:func:`keep_lease` for a run of many batches: one thread for the whole run, armed for each
    batch with :meth:`during` (starting a thread per batch cost milliseconds per batch). Renews
    the lease every `every_s` while armed and only then; never past the batch's `for_s`."""

    def __init__(self, engine: sa.Engine, db: DatabaseSettings, run: Run, *, every_s: float) -> None:
        self._engine, self._db, self._run, self._every_s = engine, db, run, every_s
        self._cond = threading.Condition()
        self._armed = False
        self._closed = False
        self._next = 0.0  # monotonic time of the next renewal
        self._deadline: float | None = None  # no renewal after this (the batch's timeout)
        self._thread: threading.Thread | None = None
        self._renewing = False

    @contextlib.contextmanager
    def during(self, for_s: float | None = None) -> Iterator[None]:
        """Keep the lease while the block runs (a batch), for at most `for_s` seconds."""
        now = time.monotonic()
        with self._cond:
            if self._closed:
                raise RuntimeError("LeaseKeeper is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"lease-{self._run.job}", daemon=True)
                self._thread.start()
            self._armed = True
            self._next = now + self._every_s
            self._deadline = None if for_s is None else now + for_s
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._armed = False
                self._cond.notify_all()
                while self._renewing:  # a renewal in flight ends before the batch does
                    self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self._every_s + 5)

    def _due(self) -> bool:
        """Wait (holding the condition) until a renewal is due; False once closed."""
        while not self._closed:
            now = time.monotonic()
            if not self._armed:
                self._cond.wait()
            elif self._deadline is not None and now >= self._deadline:
                logger.warning(
                    "job %r: batch past its timeout; the lease is no longer renewed", self._run.job
                )
                self._armed = False
            elif now < self._next:
                self._cond.wait(self._next - now)
            else:
                self._next = now + self._every_s
                return True
        return False

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._due():
                    return
                self._renewing = True
            try:
                heartbeat(self._engine, self._db, self._run)
            except Exception as exc:
                logger.warning("job %r: lease renewal failed: %s", self._run.job, exc)
            finally:
                with self._cond:
                    self._renewing = False
                    self._cond.notify_all()
