"""Many runs started (and ended) in one transaction (store.runs.start_runs, run_jobs' shared starts):
each job starts as it would alone (one bump, its run id, a live lease), a job whose start is refused
gets None and leaves the others started, and a lost COMMIT of the shared start is settled by each job's
own start with its ticket: never a second bump, never a guess.

The COMMIT is lost deterministically by tests/integration/commit/commit_cut.py (see
test_start_run_lost_commit.py): "drop" (not applied) and "cut" (applied, acknowledgement lost).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.integration.commit.commit_cut import commit_cut
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, JobAlreadyRunning, ServiceUnavailable
from txn_offsets.redaction import Secret
from txn_offsets.spark.spec import SharedStarts
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.roles import check_run_role
from txn_offsets.store.runs import (
    LOCK_TIMEOUT_S,
    Run,
    StartRequest,
    StartTicket,
    end_run,
    end_runs,
    new_run_id,
    start_run,
    start_runs,
)
from txn_offsets.store.schema import run_role_grants, tables_for

MARKER = b"SET generation = j.generation + 1"  # the shared start's bump of the generations


def _row(engine: sa.Engine, db: DatabaseSettings, job: str) -> tuple[int, str | None, bool]:
    jobs = tables_for(db.schema).jobs
    live = sa.and_(jobs.c.run_id.is_not(None), jobs.c.lease_until > sa.func.now())
    with engine.connect() as conn:
        row = conn.execute(sa.select(jobs.c.generation, jobs.c.run_id, live).where(jobs.c.job == job)).one()
    return int(row[0]), row[1], bool(row[2])


def _requests(jobs: list[str], **options: object) -> list[StartRequest]:
    return [StartRequest(StartTicket(job, new_run_id()), **options) for job in jobs]  # type: ignore[arg-type]


def test_runs_start_together_each_as_it_would_alone(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    jobs = [f"{job_name}-{c}" for c in "cab"]  # not in job order: answers come in request order
    earlier = start_run(Store(engine, migrated), jobs[1])
    assert end_run(Store(engine, migrated), earlier)
    requests = _requests(jobs, lease_s=45.0)
    runs = start_runs(Store(engine, migrated), requests)
    assert [r.job if r else None for r in runs] == jobs
    for request, run in zip(requests, runs, strict=True):
        assert run is not None and run.run_id == request.ticket.run_id
        first = 1 if run.job != jobs[1] else earlier.generation + 1
        assert run.generation == first and request.ticket.locked == first - 1
        assert _row(engine, migrated, run.job) == (run.generation, run.run_id, True)
    # each run is the live one: another start of any of them is refused, as after a start alone
    with pytest.raises(JobAlreadyRunning):
        start_run(Store(engine, migrated), jobs[2])


def test_a_refused_start_gets_none_and_the_others_start(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    a, live, b = (f"{job_name}-{c}" for c in "alb")
    running = start_run(Store(engine, migrated), live)
    requests = _requests([a, live, b])
    runs = start_runs(Store(engine, migrated), requests)
    assert [r is not None for r in runs] == [True, False, True]
    assert _row(engine, migrated, live) == (running.generation, running.run_id, True)  # untouched
    assert requests[1].ticket.locked is None  # nothing of its start happened
    # alone, with its ticket, it meets its own error
    with pytest.raises(JobAlreadyRunning):
        start_run(Store(engine, migrated), live, resume=requests[1].ticket)
    # `force` is the request's, as it is start_run's: the live run is fenced
    forced = start_runs(Store(engine, migrated), _requests([live], force=True))
    assert forced[0] is not None and forced[0].generation == running.generation + 1


def test_a_job_row_held_elsewhere_does_not_hold_up_the_others(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    """A batch of the job's last run still committing holds its row: the joint start passes it
    over (it then waits alone), the others start at once."""
    a, held, b = (f"{job_name}-{c}" for c in "ahb")
    assert end_run(Store(engine, migrated), start_run(Store(engine, migrated), held))
    jobs_table = f'"{migrated.schema}".jobs'
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"SELECT 1 FROM {jobs_table} WHERE job = :job FOR UPDATE"), {"job": held})
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        t0 = time.monotonic()
        runs = start_runs(Store(engine, migrated), _requests([a, held, b]))
        took = time.monotonic() - t0
    finally:
        release.set()
        holder.join(30)
    assert [r is not None for r in runs] == [True, False, True]
    assert took < 5, took  # the holder holds it until released (30 s): nobody waited for it
    run = start_run(Store(engine, migrated), held, lock_timeout_s=LOCK_TIMEOUT_S)  # alone, once it is free
    assert _row(engine, migrated, held) == (run.generation, run.run_id, True)


@pytest.mark.parametrize("mode", ["drop", "cut"])
def test_a_lost_shared_start_is_settled_by_each_job_alone(
    mode: str, database_url: str, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    jobs = [f"{job_name}-{i}" for i in range(3)]
    for job in jobs[:2]:  # two with an earlier run, one new
        assert end_run(Store(engine, migrated), start_run(Store(engine, migrated), job))
    before = {job: _row(engine, migrated, job)[0] if job != jobs[2] else 0 for job in jobs}
    requests = _requests(jobs)
    with commit_cut(database_url, MARKER, mode) as proxy:
        db = DatabaseSettings(Secret(proxy.url(database_url)), schema=migrated.schema)
        through = engine_for(db)
        try:
            with pytest.raises(ServiceUnavailable):
                start_runs(Store(through, db), requests)
        finally:
            through.dispose()
    assert proxy.fired.is_set()
    assert proxy.answered.is_set() is (mode == "cut")  # "cut": the lost COMMIT was applied
    for request in requests:
        job = request.ticket.job
        assert request.ticket.locked == before[job]  # what each start locked, for the settling
        run = start_run(Store(engine, migrated), job, resume=request.ticket)
        # one new generation, the ticket's run, whether the lost COMMIT was applied or not
        assert (run.generation, run.run_id) == (before[job] + 1, request.ticket.run_id)
        assert _row(engine, migrated, job) == (run.generation, run.run_id, True)


def test_bad_requests_are_refused_before_anything_changes(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    with pytest.raises(ConfigError, match="ticket"):
        start_run(Store(engine, migrated), job_name, resume=StartTicket("another", new_run_id()))
    with pytest.raises(ConfigError, match="twice"):
        start_runs(Store(engine, migrated), _requests([job_name, job_name]))
    with pytest.raises(ConfigError, match="lease_s"):
        start_runs(Store(engine, migrated), _requests([job_name], lease_s=0))
    tried = StartRequest(StartTicket(job_name, new_run_id(), locked=3))
    with pytest.raises(ConfigError, match="resume it alone"):
        start_runs(Store(engine, migrated), [tried])


@pytest.fixture
def owning_role(
    admin_engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> Iterator[DatabaseSettings]:
    """A run role that owns the job `<job_name>-own` (job_owners): it may not use unowned jobs."""
    role, password = f"run_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    with admin_engine.begin() as conn:
        # CREATE ROLE takes no bind parameters; both values are generated hex above
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        for stmt in run_role_grants(migrated.schema, role):
            conn.execute(sa.text(stmt))
        owners = tables_for(migrated.schema).owners
        conn.execute(sa.insert(owners).values(job=f"{job_name}-own", role=role))
    url = migrated.url.set(username=role, password=password)
    yield DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=migrated.schema)
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))


def test_a_job_the_role_may_not_use_is_left_to_its_own_role_check(
    owning_role: DatabaseSettings, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    own, foreign = f"{job_name}-own", f"{job_name}-foreign"
    role_engine = engine_for(owning_role)
    try:
        runs = start_runs(Store(role_engine, owning_role), _requests([own, foreign]))
        assert [r is not None for r in runs] == [True, False]
        with pytest.raises(ConfigError, match=f"may not use job '{foreign}'"):
            check_run_role(Store(role_engine, owning_role), foreign)
    finally:
        role_engine.dispose()
    with engine.connect() as conn:  # the foreign job was never made
        jobs = tables_for(migrated.schema).jobs
        assert conn.execute(sa.select(sa.func.count()).where(jobs.c.job == foreign)).scalar_one() == 0


def test_starts_asked_at_the_same_moment_are_made_together(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    """Sixteen threads (run_jobs' jobs) asking at once: each gets its own run, in fewer
    transactions than runs."""
    starts = SharedStarts()
    requests = _requests([f"{job_name}-{i:02d}" for i in range(16)])
    got: dict[str, Run | None] = {}
    go = threading.Barrier(len(requests))

    def ask(request: StartRequest) -> None:
        go.wait(30)
        got[request.ticket.job] = starts.ask(Store(engine, migrated), request)

    threads = [threading.Thread(target=ask, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for request in requests:
        run = got[request.ticket.job]
        assert run is not None and (run.generation, run.run_id) == (1, request.ticket.run_id)
        assert _row(engine, migrated, run.job) == (1, run.run_id, True)
    assert starts.asked == len(requests) and 1 <= starts.calls < len(requests)


def test_runs_ending_together_release_only_the_leases_they_hold(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    jobs = [f"{job_name}-{i}" for i in range(3)]
    runs = [r for r in start_runs(Store(engine, migrated), _requests(jobs)) if r is not None]
    newer = start_run(Store(engine, migrated), jobs[1], force=True)  # the second run was fenced meanwhile
    assert end_runs(Store(engine, migrated), runs) == [True, False, True]
    assert _row(engine, migrated, jobs[0]) == (runs[0].generation, None, False)
    assert _row(engine, migrated, jobs[1]) == (newer.generation, newer.run_id, True)  # not the old run's
    assert _row(engine, migrated, jobs[2]) == (runs[2].generation, None, False)
    assert end_runs(Store(engine, migrated), []) == []
    with pytest.raises(ConfigError, match="one run per job"):
        end_runs(Store(engine, migrated), [newer, newer])


def test_ends_asked_at_the_same_moment_are_made_together(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    runs = [
        r
        for r in start_runs(Store(engine, migrated), _requests([f"{job_name}-{i:02d}" for i in range(16)]))
        if r
    ]
    assert len(runs) == 16
    ends = SharedStarts().ends
    got: dict[str, bool | None] = {}
    go = threading.Barrier(len(runs))

    def ask(run: Run) -> None:
        go.wait(30)
        got[run.job] = ends.ask(Store(engine, migrated), run)

    threads = [threading.Thread(target=ask, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {r.job: True for r in runs}
    assert all(_row(engine, migrated, r.job) == (r.generation, None, False) for r in runs)
    assert ends.asked == len(runs) and 1 <= ends.calls < len(runs)
