"""A closed stdout and Ctrl-C end `txn-offsets` as a command-line tool ends: a listing piped into a
reader that goes away (`| head`) exits 141 quietly, as git and coreutils do; SIGINT on a command
waiting for PostgreSQL prints one line and exits 130, its transaction rolled back. Through the
installed entry point, against the real PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fix_services import Services
from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, start_run

ENTRY = str(Path(sys.executable).with_name("txn-offsets"))
CLOSED_PIPE, INTERRUPTED = 141, 130


def _closed_stdout(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the command with a stdout pipe whose reader is gone before it writes."""
    with subprocess.Popen(
        [ENTRY, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader goes away, as `head -1` does after its line
        err = proc.stderr.read()
        return proc.wait(timeout=120), err


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "PYTHONUNBUFFERED"])
def test_a_listing_into_a_closed_pipe_ends_quietly(
    services: Services, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, buffered: bool
) -> None:
    start_run(Store(engine, migrated), job_name)
    env = services.environ()
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"  # every print is a write: the error comes mid-listing
    for argv in (
        ["jobs", "list", "--schema", migrated.schema],
        ["offsets", "history", "--job", job_name, "--format", "json", "--schema", migrated.schema],
    ):
        code, err = _closed_stdout(argv, env)
        assert (code, err) == (CLOSED_PIPE, ""), (argv, code, err)


def _waiting_for_a_lock(engine: sa.Engine, schema: str) -> bool:
    """Whether a session's statement on `schema` waits for a lock (the command's)."""
    with engine.connect() as conn:
        waiting = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND position(:schema in query) > 0 AND pid <> pg_backend_pid()"
            ),
            {"schema": schema},
        ).scalar_one()
    return bool(waiting)


def test_ctrl_c_on_a_waiting_command_is_one_line_and_130(
    services: Services, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    live = start_run(Store(engine, migrated), job_name)
    jobs = f'"{migrated.schema}".jobs'
    with engine.connect() as holder:
        # the job row locked: `jobs retire --force` waits for it
        holder.execute(sa.text(f"SELECT 1 FROM {jobs} WHERE job = :j FOR UPDATE"), {"j": job_name})
        proc = subprocess.Popen(
            [
                ENTRY,
                "jobs",
                "retire",
                "--job",
                job_name,
                "--reason",
                "r",
                "--force",
                "--schema",
                migrated.schema,
            ],
            env=services.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not _waiting_for_a_lock(engine, migrated.schema):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        holder.rollback()
    assert (proc.returncode, out) == (INTERRUPTED, ""), err
    assert err == "txn-offsets: interrupted (Ctrl-C); any transaction it had open was rolled back\n"
    with engine.connect() as conn:  # nothing retired, nothing fenced
        state = lock_job(conn, migrated, job_name, for_update=False)
        retired = conn.execute(
            sa.text(f"SELECT retired_at FROM {jobs} WHERE job = :j"), {"j": job_name}
        ).scalar_one()
    assert (state.generation, state.run_id, retired) == (live.generation, live.run_id, None)
