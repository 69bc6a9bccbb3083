"""`replica.freeze` - how the failover tests and chaos F17 hang a server inside a COMMIT - on a real
process tree standing in for a postmaster and its backends (no PostgreSQL needed).

CI (the stop-34 submission) failed once with ProcessLookupError: a backend whose client had just
closed exited between the listing of the postmaster's children and its SIGSTOP."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txn_offsets.devstack import postgres, replica

# a "postmaster" with two "backends" that sleep until killed
TREE = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "time.sleep(60)\n"
)


def _cluster(where: Path) -> postgres.PgCluster:
    """A cluster whose data directory is `where` (its postmaster.pid names the stand-in)."""
    return postgres.PgCluster(
        data_dir=where, log_file=where / "log", pid_file=where / "pid", port=1, bin_dir=where, os_user=None
    )


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[postgres.PgCluster, int, list[int]]]:
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    kids = [int(p) for p in parent.stdout.readline().split()]
    (tmp_path / "postmaster.pid").write_text(f"{parent.pid}\n{tmp_path}\n")
    cluster = _cluster(tmp_path)
    try:
        yield cluster, parent.pid, kids
    finally:
        for pid in (parent.pid, *kids):
            for sig in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        parent.wait(10)
        parent.stdout.close()


def _gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(10)
    return done.pid


def test_freeze_stops_the_postmaster_and_every_child(
    tree: tuple[postgres.PgCluster, int, list[int]],
) -> None:
    cluster, parent, kids = tree
    frozen: list[int] = []
    replica.freeze(cluster, frozen)
    assert sorted(frozen) == sorted([parent, *kids])
    deadline = time.monotonic() + 10
    while {_state(p) for p in frozen} != {"T"} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {_state(p) for p in frozen} == {"T"}


def test_a_child_that_exits_before_its_signal_is_passed_over(
    tree: tuple[postgres.PgCluster, int, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listing names a backend that is gone by the time its SIGSTOP is sent: freeze stops the
    rest and records every pid (fails with ProcessLookupError before the fix)."""
    cluster, parent, kids = tree
    gone = _gone_pid()
    listed = replica._children
    monkeypatch.setattr(replica, "_children", lambda pid: [gone, *listed(pid)])
    frozen: list[int] = []
    replica.freeze(cluster, frozen)
    assert frozen[0] == parent
    assert sorted(frozen[1:]) == sorted([gone, *kids])
    deadline = time.monotonic() + 10
    while {_state(p) for p in (parent, *kids)} != {"T"} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {_state(p) for p in (parent, *kids)} == {"T"}


def test_freeze_of_a_server_that_does_not_run_stops_nothing(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    frozen: list[int] = []
    replica.freeze(cluster, frozen)
    assert frozen == []
    (tmp_path / "postmaster.pid").write_text(f"{_gone_pid()}\n")
    replica.freeze(cluster, frozen)
    assert frozen == []
