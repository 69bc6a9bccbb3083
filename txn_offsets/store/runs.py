"""Runs of a job: the fencing generation and the lease of the live run, each step written once for
N runs (one run is N = 1): started, renewed, ended.

Starting a run bumps the job's generation in the same transaction that takes the lease, so every
older run is fenced from then on: its claims carry the old generation and no longer match.

Why the claim cannot slip past a new run: a claim locks the job row ``FOR KEY SHARE`` until its
transaction ends, and everything that bumps the generation (a new run, an admin reset) first locks
the row ``FOR UPDATE``, which conflicts with it. So the bump waits for claims already in flight,
and claims that start later see the new generation. Heartbeats update only non-key columns, which
does not conflict with ``FOR KEY SHARE``: a heartbeat never waits for a batch commit.

The runs of many jobs (``run_jobs``) that start, plan or end at the same moment do it in one
transaction or statement of the same family: :func:`start_runs` (rows locked ``SKIP LOCKED``: a job
this start does not take starts alone, where it meets its own error or waits for its own row),
:func:`renew_leases`, :func:`end_runs`. What breaks a shared start's transaction (the connection, its
COMMIT) is raised for all: each job then starts alone with its :class:`StartTicket`
(``start_run(resume=...)``), which records the generation the shared start locked, reads the job row
again under lock and goes on exactly as after a lost COMMIT of its own - our run id: it committed;
that generation: it did not; anything else: Fenced. Never a second bump, never a guess.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, Fenced, JobAlreadyRunning, ServiceUnavailable, UnknownJob
from txn_offsets.store import holders, roles, run_ends
from txn_offsets.store.database import sqlstate
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import tables_for

__all__ = [
    "LOCK_TIMEOUT_S",
    "JobState",
    "Run",
    "StartRequest",
    "StartTicket",
    "already_running",
    "end_run",
    "end_runs",
    "fenced",
    "heartbeat",
    "held_update",
    "lock_job",
    "new_run_id",
    "one_run_per_job",
    "renew_lease",
    "renew_leases",
    "run_values",
    "set_lock_timeout",
    "start_run",
    "start_runs",
    "validate_job",
]

logger = logging.getLogger(__name__)

_MAX_JOB_NAME = 200


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
    lease_left_s: float | None = None  # until the lease expires unless renewed (None: no lease)
    lease_s: float | None = None  # the lease's length, as its run set it


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
        sa.extract("epoch", jobs.c.lease_until - sa.func.now()).label("lease_left"),
        jobs.c.lease_s,
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
        None if row.lease_left is None else float(row.lease_left),
        row.lease_s,
    )


#: a shared start's lock_timeout: its rows are locked SKIP LOCKED, but making a new job row waits for
#: another transaction making the same one; past this the shared start fails and each job starts
#: alone (with start_run's own lock timeout)
LOCK_TIMEOUT_S = 0.5
_START_ATTEMPTS = 5  # a start whose connection broke is tried again, the same run id each time
_START_BACKOFF_S = 0.5  # times the attempt: 0.5 + 1 + 1.5 + 2 s, about a failover's recovery


@dataclass
class StartTicket:
    """A start's identity: the run id it starts, and (once its UPDATE ran) the generation it
    locked. After a start whose COMMIT may have been lost, the ticket says what to look for."""

    job: str
    run_id: str
    locked: int | None = None


@dataclass(frozen=True)
class StartRequest:
    """One job's start: its ticket (job and a new run id), `force` and the lease, as start_run
    takes them."""

    ticket: StartTicket
    force: bool = False
    lease_s: float = 60.0


class _StartLost(Exception):
    """An attempt's connection broke; `locked` is the generation it bumped if COMMIT was sent."""

    def __init__(self, cause: Exception, locked: int | None) -> None:
        self.cause, self.locked = cause, locked


def start_run(
    store: Store,
    job: str,
    *,
    force: bool = False,
    lease_s: float = 60.0,
    lock_timeout_s: float = 30.0,
    resume: StartTicket | None = None,
) -> Run:
    """Start a run of `job`: bump the generation (fencing older runs) and take the lease.

    Refuses with JobAlreadyRunning while another run's lease is live, unless `force` - or unless
    its holder ran on this host and is provably gone (store.holders): then it takes the job over.

    The run id is the start's token. A connection that breaks during the start (a failover, a lost
    COMMIT) is tried again with the same run id (up to 5 attempts, ~5 s), and the job row, read
    again under lock, says what the lost COMMIT did: our run id -> it committed (this run goes on
    with that generation); the generation it locked -> it did not (start again); anything else ->
    another run took the job meanwhile: Fenced. Never a second bump, never a guess.

    `resume`: the ticket of a start of this job tried before in a shared transaction
    (:func:`start_runs`) that did not say whether it committed: this start goes on with its run id
    and the generation it locked, exactly as after a lost COMMIT of its own.
    """
    validate_job(job)
    lease = _validate_lease(lease_s)
    if resume is not None and resume.job != job:
        raise ConfigError("resume", f"the ticket is job {resume.job!r}'s, not {job!r}'s")
    # the ticket's `locked`: the generation a lost COMMIT of ours bumped (kept across attempts)
    request = StartRequest(resume if resume is not None else StartTicket(job, new_run_id()), force, lease)
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            return _start_alone(store, request, lock_timeout_s=lock_timeout_s, retry=attempt > 1)
        except _StartLost as exc:
            if attempt == _START_ATTEMPTS:
                raise exc.cause from None
            logger.warning(
                "job %r: connection lost while starting run %r; trying again", job, request.ticket.run_id
            )
            time.sleep(_START_BACKOFF_S * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _start_alone(store: Store, request: StartRequest, *, lock_timeout_s: float, retry: bool) -> Run:
    """One attempt of :func:`start_run`; a broken connection is _StartLost (a first attempt that
    cannot connect at all is the caller's ServiceUnavailable, as before)."""
    job = request.ticket.job
    connected = False
    try:
        with store.connect() as conn, conn.begin():
            connected = True
            set_lock_timeout(conn, lock_timeout_s)
            # row-level security would refuse the row's insert with a bare policy violation
            roles.require_reachable(conn, store.settings, job)
            run = _start_in(conn, store.settings, [request], skip_locked=False).get(job)
            if run is None:  # the row made (or found) is gone again: the job was dropped meanwhile
                raise UnknownJob(job)
    except ServiceUnavailable as exc:
        if retry or connected:  # the connection broke mid-start (or the database is still away)
            raise _StartLost(exc, request.ticket.locked) from None
        raise
    logger.info("job %r: started run %r, generation %r", job, run.run_id, run.generation)
    return run


def start_runs(
    store: Store,
    requests: Sequence[StartRequest],
    *,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> list[Run | None]:
    """Start every request's run in one transaction of five statements, whatever their number (the
    role looked up, the jobs it may use, the new job rows made, every row locked ``FOR UPDATE SKIP
    LOCKED`` in job order, one UPDATE bumping each locked job's generation with its own run id and
    lease); each run in request order, or None where this start did not take the job: a role that
    may not use it, a live run (unless `force`), a row another transaction holds (a batch of its
    last run still committing). That job then starts alone, where it meets its own error or waits
    for its own row. An error of the transaction is raised: each job then starts alone with its
    ticket (see the module)."""
    if not requests:
        return []
    _check(requests)
    started: dict[str, Run] = {}
    with store.connect() as conn, conn.begin():
        set_lock_timeout(conn, lock_timeout_s)
        check = roles.role_check(conn, store.settings)
        reachable = requests
        if check.row_security and not (check.superuser or check.owner):
            jobs = [r.ticket.job for r in requests]
            found = set(conn.execute(_reachable(store.schema), {"jobs": jobs}).scalars())
            # the others: their own role check says why
            reachable = [r for r in requests if r.ticket.job in found]
        if reachable:
            started = _start_in(conn, store.settings, reachable, skip_locked=True)
    for job, run in started.items():
        roles.warn_unconfined(check, job)
        logger.info("job %r: started run %r, generation %r", job, run.run_id, run.generation)
    return [started.get(r.ticket.job) for r in requests]


def _check(requests: Sequence[StartRequest]) -> None:
    jobs = [validate_job(r.ticket.job) for r in requests]
    if len(set(jobs)) != len(jobs):
        raise ConfigError("jobs", "a job appears twice among the runs to start together")
    for r in requests:
        if isinstance(r.lease_s, bool) or not isinstance(r.lease_s, int | float) or not r.lease_s > 0:
            raise ConfigError("lease_s", f"must be > 0 seconds, got {r.lease_s!r} for job {r.ticket.job!r}")
        if r.ticket.locked is not None:
            raise ConfigError("ticket", f"job {r.ticket.job!r}'s start was tried before: resume it alone")


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
    conn: sa.Connection, db: DatabaseSettings, requests: Sequence[StartRequest], *, skip_locked: bool
) -> dict[str, Run]:
    """The start's statements in `conn`'s transaction (the role checked): the requests' job rows made
    if new and locked FOR UPDATE in job order, and one UPDATE bumping each locked job's generation
    and taking its lease for the ticket's run id; each ticket records the generation it locked.
    Leaving the transaction commits the start. The started runs by job.

    `skip_locked` (a shared start): rows another transaction holds are passed over, and so is a job
    with a live run (unless forced); those jobs are left out. Otherwise (one job, start_run) the
    row is waited for up to the lock timeout, and a job that cannot be taken raises: a live run
    (JobAlreadyRunning, also for a batch of it still committing past the lock timeout), a lost
    start overtaken by another run (Fenced)."""
    want = {r.ticket.job: r for r in requests}
    jobs = sorted(want)  # rows made and locked in job order
    conn.execute(_insert(db.schema), {"jobs": jobs})
    states = _lock(conn, db, jobs, skip_locked=skip_locked)
    runs: dict[str, Run] = {}
    bump: list[StartRequest] = []
    gone: list[tuple[str, int, str]] = []  # runs whose holder was provably gone: taken over
    for state in states:
        request = want[state.job]
        ticket = request.ticket
        if state.run_id == ticket.run_id:  # our lost COMMIT was applied: this run goes on
            logger.warning("job %r: the lost start of run %r had committed", state.job, ticket.run_id)
            runs[state.job] = Run(state.job, state.generation, ticket.run_id)
            continue
        if ticket.locked is not None and state.generation != ticket.locked:
            raise Fenced(state.job, ticket.locked + 1, state.generation)  # another run started meanwhile
        if state.live and not request.force:
            # The holder may be provably dead: a process of this host, boot and pid namespace that
            # no longer runs (killed, crashed). Then this start takes the job over at once instead
            # of waiting out its lease. Exactly-once does not rest on this judgement: a takeover is
            # a start like force=True, whose generation bump fences anything the dead run left
            # running (a task still committing: the bump waits for its claim, and every later claim
            # or heartbeat of the old generation raises Fenced). A holder that may be alive, or runs
            # on another host, is never taken over: it is refused until its lease expires.
            verdict = holders.judge(state.run_host, state.run_process)
            if verdict.state != "gone":
                if skip_locked:
                    continue  # alone, it is refused with JobAlreadyRunning
                raise already_running(state, verdict)
            logger.warning(
                "job %r: run %r still held the lease (generation %r, lease left %.1fs), but %s: "
                "taking the job over now (the new generation fences anything it left running)",
                state.job,
                state.run_id,
                state.generation,
                float(state.lease_left_s),
                verdict.why,
            )
            gone.append((state.job, int(state.generation), str(state.run_id)))
        elif state.live:
            logger.warning(
                "job %r: forcing a new run, fencing live run %r (generation %r)",
                state.job,
                state.run_id,
                state.generation,
            )
        ticket.locked = state.generation  # the caller's COMMIT (or its loss) decides the rest
        bump.append(request)
    if bump:
        values = {
            "jobs": [r.ticket.job for r in bump],
            "run_ids": [r.ticket.run_id for r in bump],
            "leases": [float(r.lease_s) for r in bump],
            "host": socket.gethostname(),
            "process": holders.this_process(),
        }
        for job, generation in conn.execute(_bump(db.schema), values).all():
            runs[job] = Run(job, int(generation), want[job].ticket.run_id)
        run_ends.mark_taken_over(conn, db.schema, [g for g in gone if g[0] in runs])
    return runs


def already_running(
    state: Any, verdict: holders.Verdict = holders.UNKNOWN, held: str = "?"
) -> JobAlreadyRunning:
    """The refusal of a move (a start, a reset, an import, a retire) by the live run of a job row (a
    JobState, or :func:`_locking`'s): when its lease expires, its length, what this host knows of it."""
    return JobAlreadyRunning(
        state.job,
        state.run_id or held,
        state.generation,
        float(state.heartbeat_age_s),
        lease_left_s=None if state.lease_left_s is None else float(state.lease_left_s),
        lease_s=None if state.lease_s is None else float(state.lease_s),
        holder=verdict.why if verdict.state == "alive" else "",
    )


def _lock(conn: sa.Connection, db: DatabaseSettings, jobs: list[str], *, skip_locked: bool) -> list[Any]:
    """The jobs' rows FOR UPDATE (:func:`_locking`); waiting for them (one job), a batch of the
    current run still committing past the start's lock_timeout is JobAlreadyRunning."""
    if skip_locked:
        return list(conn.execute(_locking(db.schema, True), {"jobs": jobs}).all())
    try:
        with conn.begin_nested():
            return list(conn.execute(_locking(db.schema, False), {"jobs": jobs}).all())
    except sa.exc.OperationalError as exc:
        if sqlstate(exc) != "55P03":  # lock_not_available
            raise
        state = lock_job(conn, db, jobs[0], for_update=False)
        raise already_running(state, held="(a transaction in flight)") from None


def renew_lease(conn: sa.Connection, db: DatabaseSettings, run: Run) -> JobState:
    """Extend the lease of `run` in the caller's transaction and return the job row; raises Fenced
    if a newer run (or a reset) took the job (:func:`renew_leases` of one run).

    The generation is checked by the same statement that renews the lease, and the row stays
    locked (FOR NO KEY UPDATE) until the transaction ends, so a new run's bump (FOR UPDATE) waits
    for it; claims (FOR KEY SHARE) do not. Offsets moved later in the same transaction are
    therefore moved by the current run or not at all, as with ``offset_rows.check_generation``.
    """
    state = renew_leases(conn, db, [run]).get(run.job)
    if state is None:
        fenced(conn, db, run)
    return state


def renew_leases(conn: sa.Connection, db: DatabaseSettings, runs: Sequence[Run]) -> dict[str, JobState]:
    """Extend the lease of each run that still holds its job, in one statement in the caller's
    transaction (the plans of many jobs made together renew them all): the job row of each, by job.
    A run missing from the answer was fenced (:func:`fenced` says by whom).

    The rows are locked (FOR NO KEY UPDATE) in job order, so two such statements over overlapping
    jobs cannot deadlock; claims (FOR KEY SHARE) do not wait for them."""
    if not one_run_per_job(runs, "renew_leases"):
        return {}
    rows = conn.execute(_renew(db.schema, len(runs) == 1), run_values(runs)).all()
    want = {r.job: r for r in runs}
    return {
        row.job: JobState(
            row.job,
            want[row.job].generation,
            want[row.job].run_id,
            row.heartbeat_at,
            row.lease_until,
            True,
            0.0,
            row.first_plan_at,
        )
        for row in rows
    }


def fenced(conn: sa.Connection, db: DatabaseSettings, run: Run) -> NoReturn:
    """Raise Fenced for `run`, which no longer holds its job, naming the generation that does."""
    state = lock_job(conn, db, run.job, for_update=False)
    raise Fenced(run.job, run.generation, state.generation)


def heartbeat(store: Store, run: Run) -> None:
    """Extend the lease of `run`; raises Fenced if a newer run (or a reset) took the job."""
    with store.begin() as conn:
        renew_lease(conn, store.settings, run)


def end_run(store: Store, run: Run) -> bool:
    """Release the lease if `run` still holds it; returns whether it did (False: fenced meanwhile)."""
    return end_runs(store, [run])[0]


def end_runs(store: Store, runs: Sequence[Run]) -> list[bool]:
    """Release the lease of each run that still holds it (its generation and run id), in one
    statement; whether each did (False: fenced meanwhile), in `runs` order."""
    if not one_run_per_job(runs, "end_runs"):
        return []
    with store.begin() as conn:
        released = set(conn.execute(_release(store.schema, len(runs) == 1), run_values(runs)).scalars())
    for run in runs:
        if run.job not in released:
            logger.info("job %r: run %r no longer held the lease at its end", run.job, run.run_id)
    return [r.job in released for r in runs]


def one_run_per_job(runs: Sequence[Run], what: str) -> bool:
    """Whether there are `runs` to send (a ConfigError naming `what` if a job has two of them)."""
    if len({r.job for r in runs}) != len(runs):
        raise ConfigError("runs", f"{what} takes at most one run per job")
    return bool(runs)


def run_values(runs: Sequence[Run]) -> dict[str, Any]:
    """The bound values of :func:`held_update`'s statement for `runs`: each run's job, generation
    and run id (arrays; one run's as they are)."""
    if len(runs) == 1:
        return {"job": runs[0].job, "generation": runs[0].generation, "run_id": runs[0].run_id}
    return {
        "jobs": [r.job for r in runs],
        "generations": [r.generation for r in runs],
        "run_ids": [r.run_id for r in runs],
    }


def held_update(schema: str, assignments: str, returning: str, *, one: bool) -> str:
    """An UPDATE (`assignments`, then RETURNING `returning`) of the job row of each run that still
    holds its job (its generation and run id): the statement family of renewing and ending runs.
    Several runs' rows are locked FOR NO KEY UPDATE in job order first, so two such statements over
    overlapping jobs cannot deadlock and claims (FOR KEY SHARE) do not wait for them; `one` run's
    row is matched directly (one row: no order to keep, and ~1 ms less than the join of arrays for
    a running job's one-statement plan). Built from a validated schema name (tables_for) and our
    own SQL text; the runs are bound (:func:`run_values`)."""
    table = _table(schema)
    if one:
        return f"""UPDATE {table} j
SET {assignments}
WHERE j.job = :job AND j.generation = :generation AND j.run_id = :run_id
RETURNING {returning}"""  # noqa: S608 - identifiers from a validated schema name, values bound
    return f"""UPDATE {table} j
SET {assignments}
FROM (
    SELECT h.job FROM {table} h
    JOIN unnest(CAST(:jobs AS text[]), CAST(:generations AS bigint[]), CAST(:run_ids AS text[]))
        AS w(job, generation, run_id) ON h.job = w.job AND h.generation = w.generation AND h.run_id = w.run_id
    ORDER BY h.job
    FOR NO KEY UPDATE OF h
) held
WHERE j.job = held.job
RETURNING {returning}"""  # noqa: S608 - identifiers from a validated schema name, values bound


#: a renewal's assignments: the heartbeat now, the lease its length from now
RENEWAL = (
    "heartbeat_at = now(), lease_until = now() + make_interval(0, 0, 0, 0, 0, 0, coalesce(j.lease_s, 60.0))"
)


def _table(schema: str) -> str:
    jobs = tables_for(schema).jobs  # a validated schema name
    return f'"{jobs.schema}".{jobs.name}'


@functools.lru_cache(maxsize=64)
def _renew(schema: str, one: bool) -> sa.TextClause:
    returning = "j.job, j.heartbeat_at, j.lease_until, j.first_plan_at"
    return sa.text(held_update(schema, RENEWAL, returning, one=one))


@functools.lru_cache(maxsize=64)
def _release(schema: str, one: bool) -> sa.TextClause:
    return sa.text(held_update(schema, "run_id = NULL, lease_until = NULL", "j.job", one=one))


@functools.lru_cache(maxsize=64)
def _reachable(schema: str) -> sa.TextClause:
    fn = f'"{tables_for(schema).jobs.schema}".job_reachable'  # a validated schema name
    return sa.text(f"SELECT j FROM unnest(CAST(:jobs AS text[])) AS j WHERE {fn}(j, current_user)")  # noqa: S608


@functools.lru_cache(maxsize=64)
def _insert(schema: str) -> sa.TextClause:
    sql = f"INSERT INTO {_table(schema)} (job) SELECT unnest(CAST(:jobs AS text[])) ON CONFLICT DO NOTHING"
    return sa.text(sql)


@functools.lru_cache(maxsize=64)
def _locking(schema: str, skip_locked: bool) -> sa.TextClause:
    """The rows of the jobs, locked as a start locks them (FOR UPDATE: after claims in flight), in
    job order, `skip_locked` passing over those another transaction holds; the lease and the
    heartbeat's age judged by the database clock."""
    sql = f"""SELECT job, generation, run_id, (run_id IS NOT NULL AND lease_until > now()) AS live,
    coalesce(extract(epoch FROM now() - heartbeat_at), 0.0) AS heartbeat_age_s, run_host, run_process,
    lease_s, coalesce(extract(epoch FROM lease_until - now()), 0.0) AS lease_left_s
FROM {_table(schema)} WHERE job = ANY(CAST(:jobs AS text[]))
ORDER BY job FOR UPDATE{" SKIP LOCKED" if skip_locked else ""}"""  # noqa: S608 - identifiers from a validated schema name, values bound
    return sa.text(sql)


@functools.lru_cache(maxsize=64)
def _bump(schema: str) -> sa.TextClause:
    """The start's UPDATE for each locked job: the next generation, its run id and lease."""
    sql = f"""UPDATE {_table(schema)} j
SET generation = j.generation + 1, run_id = w.run_id, run_host = :host, run_process = :process,
    lease_s = w.lease, started_at = now(), heartbeat_at = now(),
    lease_until = now() + make_interval(0, 0, 0, 0, 0, 0, w.lease)
FROM unnest(CAST(:jobs AS text[]), CAST(:run_ids AS text[]), CAST(:leases AS double precision[]))
    AS w(job, run_id, lease)
WHERE j.job = w.job
RETURNING j.job, j.generation"""  # noqa: S608 - identifiers from a validated schema name, values bound
    return sa.text(sql)
