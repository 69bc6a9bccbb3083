"""The starts and ends of many runs in one transaction (``run_jobs``: dozens of jobs of one application).

A run's start is a role check, then a transaction that makes the job row if new, locks it
``FOR UPDATE`` (waiting for claims in flight), bumps the generation and takes the lease
(:func:`txn_offsets.store.runs.start_run`). Thirty-two jobs starting at once are 64 transactions
on a shared pool, all before any job's first batch. :func:`start_runs` starts them in ONE
transaction of five statements, whatever their number: the role looked up, the jobs it may use,
the new job rows made, every row locked ``FOR UPDATE SKIP LOCKED`` in job order, and one UPDATE
bumping each locked job's generation with its own run id and lease.

A job this start does not take is left to start alone, where it meets its own error or waits for
its own row: a role that may not use it, a live run (unless `force`), or a row another transaction
holds (a batch of its last run still committing: SKIP LOCKED passes it over instead of holding up
every job's start). What breaks the transaction (the connection, its COMMIT) is raised for all:
each job then starts alone with its :class:`~txn_offsets.store.runs.StartTicket`
(``start_run(resume=...)``), which records the generation this start locked, reads the job row
again under lock and goes on exactly as after a lost COMMIT of its own - our run id: it committed;
that generation: it did not; anything else: Fenced. Never a second bump, never a guess.

:func:`end_runs` releases the leases of runs that end at the same moment in one statement, as
``end_run`` releases one: only a lease the run still holds (its generation and run id). Where it
fails, each run releases its own.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.store import roles
from txn_offsets.store.database import translate_errors
from txn_offsets.store.lease import run_values, update_held
from txn_offsets.store.runs import Run, StartTicket, set_lock_timeout, validate_job
from txn_offsets.store.schema import tables_for

__all__ = ["LOCK_TIMEOUT_S", "StartRequest", "end_runs", "start_runs"]

logger = logging.getLogger(__name__)

#: the joint start's lock_timeout: its rows are locked SKIP LOCKED, but making a new job row waits
#: for another transaction making the same one; past this the joint start fails and each job starts
#: alone (with start_run's own lock timeout)
LOCK_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class StartRequest:
    """One job's start: its ticket (job and a new run id), `force` and the lease, as start_run
    takes them."""

    ticket: StartTicket
    force: bool = False
    lease_s: float = 60.0


def start_runs(
    engine: sa.Engine,
    db: DatabaseSettings,
    requests: Sequence[StartRequest],
    *,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> list[Run | None]:
    """Start every request's run in one transaction; each run in request order, or None where this
    start did not take the job (it then starts alone). An error of the transaction is raised: each
    job then starts alone with its ticket (see the module)."""
    if not requests:
        return []
    _check(requests)
    want = {r.ticket.job: r for r in requests}
    jobs = sorted(want)  # rows made and locked in job order
    schema = db.schema
    started: dict[str, Run] = {}
    with translate_errors(db), engine.connect() as conn, conn.begin():
        set_lock_timeout(conn, lock_timeout_s)
        check = roles.role_check(conn, db)
        if check.row_security and not (check.superuser or check.owner):
            reachable = set(conn.execute(_reachable(schema), {"jobs": jobs}).scalars())
            jobs = [j for j in jobs if j in reachable]  # the others: their role check says why
        if jobs:
            conn.execute(_insert(schema), {"jobs": jobs})
        states = conn.execute(_lock(schema), {"jobs": jobs}).all() if jobs else []
        bump = []
        for state in states:  # the rows no other transaction holds
            request = want[state.job]
            if state.live and not request.force:
                continue  # alone, it is refused with JobAlreadyRunning
            if state.live:
                logger.warning(
                    "job %r: forcing a new run, fencing live run %r (generation %r)",
                    state.job,
                    state.run_id,
                    state.generation,
                )
            request.ticket.locked = state.generation  # what a lost COMMIT would have bumped
            bump.append(request)
        if bump:
            values = {
                "jobs": [r.ticket.job for r in bump],
                "run_ids": [r.ticket.run_id for r in bump],
                "leases": [float(r.lease_s) for r in bump],
                "host": socket.gethostname(),
            }
            for job, generation in conn.execute(_bump(schema), values).all():
                started[job] = Run(job, int(generation), want[job].ticket.run_id)
    for job, run in started.items():
        roles.warn_unconfined(check, job)
        logger.info("job %r: started run %r, generation %r", job, run.run_id, run.generation)
    return [started.get(r.ticket.job) for r in requests]


def end_runs(engine: sa.Engine, db: DatabaseSettings, runs: Sequence[Run]) -> list[bool]:
    """Release the lease of each run that still holds it, in one statement; whether each did (False:
    fenced meanwhile), in `runs` order."""
    if len({r.job for r in runs}) != len(runs):
        raise ConfigError("runs", "end_runs takes at most one run per job")
    if not runs:
        return []
    with translate_errors(db), engine.begin() as conn:
        released = set(conn.execute(_release(db.schema), run_values(runs)).scalars())
    for run in runs:
        if run.job not in released:
            logger.info("job %r: run %r no longer held the lease at its end", run.job, run.run_id)
    return [r.job in released for r in runs]


def _check(requests: Sequence[StartRequest]) -> None:
    jobs = [validate_job(r.ticket.job) for r in requests]
    if len(set(jobs)) != len(jobs):
        raise ConfigError("jobs", "a job appears twice among the runs to start together")
    for r in requests:
        if isinstance(r.lease_s, bool) or not isinstance(r.lease_s, int | float) or not r.lease_s > 0:
            raise ConfigError("lease_s", f"must be > 0 seconds, got {r.lease_s!r} for job {r.ticket.job!r}")
        if r.ticket.locked is not None:
            raise ConfigError("ticket", f"job {r.ticket.job!r}'s start was tried before: resume it alone")


def _table(schema: str) -> str:
    jobs = tables_for(schema).jobs  # a validated schema name
    return f'"{jobs.schema}".{jobs.name}'


@functools.lru_cache(maxsize=64)
def _reachable(schema: str) -> sa.TextClause:
    fn = f'"{tables_for(schema).jobs.schema}".job_reachable'  # a validated schema name
    return sa.text(f"SELECT j FROM unnest(CAST(:jobs AS text[])) AS j WHERE {fn}(j, current_user)")  # noqa: S608


@functools.lru_cache(maxsize=64)
def _insert(schema: str) -> sa.TextClause:
    sql = f"INSERT INTO {_table(schema)} (job) SELECT unnest(CAST(:jobs AS text[])) ON CONFLICT DO NOTHING"
    return sa.text(sql)


@functools.lru_cache(maxsize=64)
def _lock(schema: str) -> sa.TextClause:
    """The rows of the jobs, locked as a start locks one (FOR UPDATE: after claims in flight), in job
    order, passing over those another transaction holds; the lease judged by the database clock."""
    sql = f"""SELECT job, generation, run_id, (run_id IS NOT NULL AND lease_until > now()) AS live
FROM {_table(schema)} WHERE job = ANY(CAST(:jobs AS text[]))
ORDER BY job FOR UPDATE SKIP LOCKED"""  # noqa: S608 - identifiers from a validated schema name, values bound
    return sa.text(sql)


@functools.lru_cache(maxsize=64)
def _bump(schema: str) -> sa.TextClause:
    """start_run's UPDATE for each locked job: the next generation, its run id and lease."""
    sql = f"""UPDATE {_table(schema)} j
SET generation = j.generation + 1, run_id = w.run_id, run_host = :host, lease_s = w.lease,
    started_at = now(), heartbeat_at = now(), lease_until = now() + make_interval(0, 0, 0, 0, 0, 0, w.lease)
FROM unnest(CAST(:jobs AS text[]), CAST(:run_ids AS text[]), CAST(:leases AS double precision[]))
    AS w(job, run_id, lease)
WHERE j.job = w.job
RETURNING j.job, j.generation"""  # noqa: S608 - identifiers from a validated schema name, values bound
    return sa.text(sql)


@functools.lru_cache(maxsize=64)
def _release(schema: str) -> sa.TextClause:
    """end_run's UPDATE for each run that still holds its job (rows locked as renew_leases locks them)."""
    return update_held(schema, "run_id = NULL, lease_until = NULL", "j.job")
