"""The embedded stack in a private directory: up is idempotent, down leaves nothing of ours running,
stale pid files and busy ports give errors that say what to do."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from txn_offsets.devstack import Stack
from txn_offsets.devstack._proc import pick_free_port, pid_alive
from txn_offsets.devstack.readiness import kafka_round_trip
from txn_offsets.errors import StackError


@pytest.fixture
def private_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    for var in ("TXN_OFFSETS_PG_PORT", "TXN_OFFSETS_KAFKA_PORT", "TXN_OFFSETS_KAFKA_CONTROLLER_PORT"):
        monkeypatch.delenv(var, raising=False)
    stack = Stack(tmp_path / "stack")
    yield stack
    stack.down()
    from txn_offsets.devstack import postgres

    data_base = postgres.cluster_for(stack.dir, 1).data_dir.parent
    if not str(data_base).startswith(str(tmp_path)):
        shutil.rmtree(data_base.parent, ignore_errors=True)


def test_up_twice_then_down(private_stack: Stack) -> None:
    """A second `up` changes nothing: the same processes and ports, and the app role's password
    verifier untouched - a plain `dev up` after `dev up --pooler pgbouncer` used to set the same
    password again (a new SCRAM salt), and the running PgBouncer's userlist no longer let it log
    in to the server: every pooled connection failed with 'password authentication failed'."""
    first = private_stack.up(pooler="pgbouncer")
    second = private_stack.up()  # harmless: same processes, same ports
    assert (first.postgres_pid, first.kafka_pid) == (second.postgres_pid, second.kafka_pid)
    assert first.postgres_pid and first.kafka_pid
    env = private_stack.env()
    kafka_round_trip(env["TXN_OFFSETS_KAFKA_BOOTSTRAP"])
    for variable, role in (
        ("TXN_OFFSETS_DATABASE_URL", "job_runner"),
        ("TXN_OFFSETS_OWNER_DATABASE_URL", "txn_offsets"),
    ):
        url = env[variable].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as conn:  # the run role jobs run as; the database's owner
            assert conn.execute("SELECT current_user").fetchone() == (role,)
    with psycopg.connect(env["TXN_OFFSETS_ADMIN_DATABASE_URL"].replace("+psycopg", "")) as conn:
        attributes = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls FROM pg_roles "
            "WHERE rolname = 'job_runner'"
        ).fetchone()
        assert attributes == (False, False, False, False)  # a job's role: no DDL beyond its grants, no bypass
        # the server keeps each statement's text (pg_stat_statements, created in the project's
        # database): the roles were created with SCRAM verifiers, never a password in clear
        texts = [
            q for (q,) in conn.execute("SELECT query FROM pg_stat_statements WHERE query ILIKE '%%ROLE%%'")
        ]
        assert any("PASSWORD 'SCRAM-SHA-256$" in q for q in texts), texts
        secrets = {make_url(env[v]).password for v in env if v.endswith("DATABASE_URL")} - {None}
        assert len(secrets) == 3  # the administrator's, the owner's, the run role's
        assert not [q for q in texts for secret in secrets if secret and secret in q]
    pooled = env["TXN_OFFSETS_POOLED_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(pooled) as conn:  # through PgBouncer, after the second up
        assert conn.execute("SELECT current_user").fetchone() == ("txn_offsets",)
    assert oct(private_stack.env_file.stat().st_mode & 0o777) == "0o600"
    assert sorted(private_stack.down()) == ["kafka", "pgbouncer", "postgres"]
    assert not pid_alive(first.postgres_pid)
    assert not pid_alive(first.kafka_pid)
    assert private_stack.down() == []  # nothing left to stop
    status = private_stack.status()
    assert (status.postgres_pid, status.kafka_pid) == (None, None)


def _dead_pid() -> int:
    dead = pick_free_port()  # any number that is not a live pid is fine; find one
    while pid_alive(dead):
        dead += 1
    return dead


def test_status_reports_a_stale_pid_file_and_leaves_it(private_stack: Stack) -> None:
    """`dev status` only reports: a pid file whose process is gone is named stale, and kept (it
    used to be deleted, with a WARNING log line and no word of it in the status)."""
    private_stack.status()  # the stack's state.json, as a stack that was up once has it
    pid_file = private_stack.dir / "kafka.pid"
    pid_file.write_text(f"{_dead_pid()}\n")
    state = json.loads((private_stack.dir / "state.json").read_text())
    cli = Path(sys.executable).parent / "txn-offsets"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXN_OFFSETS_")}
    done = subprocess.run(
        [str(cli), "dev", "status", "--stack-dir", str(private_stack.dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert (done.returncode, done.stderr) == (3, ""), done.stderr
    assert done.stdout.splitlines() == [
        f"postgres  {'stopped':22} 127.0.0.1:{state['pg_port']}",
        f"kafka     {'stopped':22} 127.0.0.1:{state['kafka_port']} "
        f"(stale pid file {pid_file}: its process is gone)",
    ]
    assert pid_file.exists()
    assert private_stack.status().stale == {"kafka": pid_file} and pid_file.exists()


def test_stale_pid_files(private_stack: Stack) -> None:
    private_stack.status()  # the stack's state.json, as a stack that was up once has it
    (private_stack.dir / "kafka.pid").write_text(f"{_dead_pid()}\n")
    # a dead pid is cleaned up by the commands that act (down here, up alike)
    assert private_stack.down() == []
    assert not (private_stack.dir / "kafka.pid").exists()
    # a live pid that is not ours is never signalled: clear error naming the file to remove
    (private_stack.dir / "kafka.pid").write_text(f"{os.getpid()}\n")
    with pytest.raises(StackError, match=r"kafka.pid.*stale|stale.*kafka.pid"):
        private_stack.down()
    assert pid_alive(os.getpid())
    (private_stack.dir / "kafka.pid").unlink()


def test_busy_port_is_named(private_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        monkeypatch.setenv("TXN_OFFSETS_KAFKA_PORT", str(port))
        with pytest.raises(
            StackError, match=rf"port 127.0.0.1:{port} is already in use.*TXN_OFFSETS_KAFKA_PORT"
        ):
            private_stack.up()
