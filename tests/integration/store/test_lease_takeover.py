"""A start whose job's lease is held by a process of this host that is provably gone takes the job
over at once (issue 44, item 8); a holder that may be alive - running here, or on another host - is
refused, and the refusal says when the lease expires and what sets its length."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import REPO
from txn_offsets import Fenced, JobAlreadyRunning
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import holders
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, heartbeat, lock_job, start_run

LEASE_S = 120.0  # far longer than any test waits: a start that succeeds did not wait for it


@dataclass
class Holder:
    """A process of this host holding the job's lease (tests/integration/store/lease_holder.py)."""

    proc: subprocess.Popen[str]
    run: Run


@pytest.fixture
def holder(database_url: str, migrated: DatabaseSettings, job_name: str) -> Iterator[Holder]:
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.store.lease_holder",
            migrated.schema,
            job_name,
            str(LEASE_S),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the holder did not start its run"
        yield Holder(proc, Run(**json.loads(line)))
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _row(engine: sa.Engine, db: DatabaseSettings, job: str) -> Any:
    jobs = sa.table(
        "jobs", sa.column("job"), sa.column("run_host"), sa.column("run_process"), schema=db.schema
    )
    with engine.connect() as conn:
        return conn.execute(sa.select(jobs.c.run_host, jobs.c.run_process).where(jobs.c.job == job)).one()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(
    engine: sa.Engine, migrated: DatabaseSettings, holder: Holder
) -> None:
    store = Store(engine, migrated)
    assert _row(engine, migrated, holder.run.job).run_process == holders.process_of(holder.proc.pid)
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    began = time.monotonic()
    newer = start_run(store, holder.run.job)  # before: JobAlreadyRunning for up to LEASE_S
    assert time.monotonic() - began < 10
    assert newer.generation == holder.run.generation + 1  # the bump fences whatever the dead run left
    with pytest.raises(Fenced):
        heartbeat(store, holder.run)
    with engine.connect() as conn:
        state = lock_job(conn, migrated, newer.job, for_update=False)
    assert (state.run_id, state.live) == (newer.run_id, True)


def test_a_live_holder_is_refused_with_when_its_lease_expires(
    engine: sa.Engine, migrated: DatabaseSettings, holder: Holder
) -> None:
    with pytest.raises(JobAlreadyRunning) as info:
        start_run(Store(engine, migrated), holder.run.job)
    err = info.value
    assert err.run_id == holder.run.run_id and err.lease_s == LEASE_S
    assert err.lease_left_s is not None and LEASE_S - 30 < err.lease_left_s <= LEASE_S
    assert err.holder == f"its process {holder.proc.pid} is running on this host"
    assert (
        f"; its lease expires in {err.lease_left_s:.1f}s unless renewed (lease_s=120, set by run_job's "
        f"lease_s); its process {holder.proc.pid} is running on this host). Stop that run"
    ) in str(err)
    with engine.connect() as conn:
        assert lock_job(conn, migrated, holder.run.job, for_update=False).generation == holder.run.generation


def test_a_frozen_holder_is_alive_and_refused(
    engine: sa.Engine, migrated: DatabaseSettings, holder: Holder
) -> None:
    holder.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(JobAlreadyRunning):
            start_run(Store(engine, migrated), holder.run.job)
    finally:
        holder.proc.send_signal(signal.SIGCONT)


def test_a_dead_holder_of_another_host_is_never_judged_by_its_pid(
    engine: sa.Engine, migrated: DatabaseSettings, holder: Holder
) -> None:
    jobs = sa.table("jobs", sa.column("job"), sa.column("run_host"), schema=migrated.schema)
    with engine.begin() as conn:  # the same pid namespace's numbers, but recorded by another host
        conn.execute(sa.update(jobs).where(jobs.c.job == holder.run.job).values(run_host="another-host"))
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    with pytest.raises(JobAlreadyRunning) as info:
        start_run(Store(engine, migrated), holder.run.job)
    assert "its lease expires in" in str(info.value) and info.value.holder == ""


def test_a_reused_pid_is_a_gone_holder(engine: sa.Engine, migrated: DatabaseSettings, holder: Holder) -> None:
    # the holder's pid now belongs to a live process that started later (another start time)
    recorded = holders.Holder.parse(_row(engine, migrated, holder.run.job).run_process)
    assert recorded is not None
    later = str(holders.Holder(recorded.boot, recorded.pidns, recorded.pid, recorded.start + 1))
    jobs = sa.table("jobs", sa.column("job"), sa.column("run_process"), schema=migrated.schema)
    with engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job == holder.run.job).values(run_process=later))
    newer = start_run(Store(engine, migrated), holder.run.job)
    assert newer.generation == holder.run.generation + 1
