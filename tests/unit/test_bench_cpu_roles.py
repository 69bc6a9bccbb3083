"""benchmarks.resources.cpu_by_role: the CPU of a run by process, read from /proc (Linux).

Real processes, no mocks: a child of this process that burns CPU counts as "other" in this
process's tree, and a process named as a service counts under that service's name with its own
children (a PostgreSQL backend's time, say, under the postmaster's); readings subtract per role."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks import resources, user_scale

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def _burn(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BURN.format(s=seconds)])


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")


def test_a_child_that_burns_cpu_counts_as_other_and_the_driver_as_itself() -> None:
    child = _burn(0.4)
    try:
        before = resources.cpu_by_role({})
        assert set(before) == set(resources.TREE_ROLES)
        end = time.process_time() + 0.2
        while time.process_time() < end:  # the driver's own CPU
            pass
        child.wait(timeout=30)  # reaped by this process: its time is gone from the tree...
        after = resources.cpu_by_role({})
    finally:
        child.kill()
        child.wait()
    spent = resources.used(before, after)
    assert spent["driver"] >= 0.15
    # ...and, reaped by the root, is the root's children's time, which the driver role leaves out
    assert spent["driver"] < 0.35
    assert all(v >= 0.0 for v in spent.values())


def test_a_service_counts_with_its_children_under_its_name() -> None:
    # a shell as the "service", its child burning: reaped by the shell, counted in its tree
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{BURN.format(s=0.3)}'; sleep 30"])
    try:
        before = resources.cpu_by_role({"svc": shell.pid, "gone": None})
        deadline = time.monotonic() + 30
        after = before
        while time.monotonic() < deadline:
            after = resources.cpu_by_role({"svc": shell.pid, "gone": None})
            if after["svc"] - before["svc"] >= 0.25:
                break
            time.sleep(0.05)
    finally:
        shell.kill()
        shell.wait()
    spent = resources.used(before, after)
    assert spent["svc"] >= 0.25
    assert spent["gone"] == 0.0
    # the service is not in this process's tree roles
    assert spent["other"] < 0.25


def test_used_never_goes_negative_and_takes_the_after_roles() -> None:
    assert resources.used({"a": 2.0, "b": 1.0}, {"a": 1.5, "b": 3.0, "c": 0.5}) == {
        "a": 0.0,
        "b": 2.0,
        "c": 0.5,
    }


def test_the_cpu_line_lists_roles_largest_first_without_the_idle_ones() -> None:
    line = user_scale.cpu_line({"postgres": 230.4, "driver": 61.0, "pgbouncer": 0.0, "kafka": 110.2})
    assert line == "cpu/batch 402 ms: postgres 230, kafka 110, driver 61"


def test_without_a_local_stack_no_service_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXN_OFFSETS_STACK_DIR", raising=False)
    assert resources.stack_services() == {}
    monkeypatch.setenv("TXN_OFFSETS_STACK_DIR", "/nonexistent/stack")
    assert resources.stack_services() == {}
