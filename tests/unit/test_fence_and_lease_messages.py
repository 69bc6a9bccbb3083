"""What a fenced run and a refused start say (issue 44, items 3 and 8), and how a lease holder's
process is judged from its host: gone only when provably so."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from txn_offsets.errors import Fenced, FencedBy, JobAlreadyRunning, RunCommitted
from txn_offsets.store import holders

AT = datetime(2026, 11, 28, 12, 0, 1, tzinfo=UTC)


def test_a_reset_names_who_when_why_and_what_the_run_had_committed() -> None:
    by = FencedBy("reset", 10, "alice@box", AT, "replay\nTuesday")
    done = RunCommitted("h:4121:9f2c", 4, ranges=8, through=(("s", 0, 400), ("s", 1, 380)))
    err = Fenced("wc", 9, 10, by=by, committed=done)
    assert str(err) == (
        "run generation 9 of job 'wc' was fenced by an offsets reset (generation 10) by alice@box at "
        "2026-11-28 12:00:01+00:00, reason 'replay Tuesday'. Before it, this run (h:4121:9f2c) committed "
        "4 batches (8 range(s), through s[0]@400, s[1]@380): those stay committed, counted once; nothing "
        "after them was written. This run stops; the next run starts from the stored offsets."
    )
    assert "\n" not in str(err)
    again = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own error, as a task reports it
    assert (again.by, again.committed, str(again)) == (by, done, str(err))


@pytest.mark.parametrize(
    ("by", "says"),
    [
        (
            FencedBy("import", 3, "bob@h", AT, "import from group g"),
            "by an offsets import (generation 3) by bob@h",
        ),
        (FencedBy("retire", 3, "bob@h", AT, "gone"), "by jobs retire (generation 3) by bob@h"),
        (FencedBy("retire", 3, at=AT), "by jobs retire (generation 3) at 2026-11-28 12:00:01+00:00 (the job"),
        (
            FencedBy("run", 3, "w2:77:ab", AT),
            "by a newer run of this job (generation 3, run w2:77:ab, started at",
        ),
        (FencedBy("run", 3, host="w2"), "by a newer run of this job (generation 3, on host w2)"),
        (None, "by generation 5 (a newer run, an offsets reset, an offsets import or jobs retire"),
    ],
)
def test_each_cause_is_named(by: FencedBy | None, says: str) -> None:
    err = Fenced("wc", 2, 5, by=by)
    assert says in str(err)
    if by is not None:
        assert "(the job is at generation 5 now)" in str(err)  # the fencer's 3 is not the current 5
    assert "nothing of it was written" not in str(err)
    assert "What this run committed before it stays committed" in str(err)


def test_the_batch_in_flight_is_said_in_part_and_long_lists_are_cut() -> None:
    through = tuple(("t", p, 100 * p) for p in range(5))
    err = Fenced("wc", 2, 3, committed=RunCommitted("r", 4, ranges=11, in_flight=1, through=through))
    assert (
        "committed 4 batches and 1 range(s) of batch 5, which was in flight (11 range(s), through t[0]@0, "
        "t[1]@100, t[2]@200 and 2 more partition(s)): those stay committed, counted once; the rest of "
        "batch 5 was not written."
    ) in str(err)
    assert "had committed nothing before it" in str(Fenced("wc", 2, 3, committed=RunCommitted("r", 0, 0)))
    assert "the lineage is off" in str(Fenced("wc", 2, 3, committed=RunCommitted("r", 3)))


def test_a_refused_start_says_when_the_lease_expires_and_what_sets_it() -> None:
    err = JobAlreadyRunning(
        "wc",
        "h:1:ab",
        7,
        22.1,
        lease_left_s=37.94,
        lease_s=60,
        holder="its process 1 is running on this host",
    )
    assert str(err) == (
        "job 'wc' is held by live run h:1:ab (generation 7, last heartbeat 22.1s ago; its lease expires in "
        "37.9s unless renewed (lease_s=60, set by run_job's lease_s); its process 1 is running on this "
        "host). Stop that run (SIGTERM ends it between batches and frees the lease), wait for the lease "
        "to expire, or pass force=True / --force to fence it now."
    )
    assert err.lease_left_s == pytest.approx(37.94)
    assert "expires" not in str(JobAlreadyRunning("wc", "h:1:ab", 7, 1.0))


# -- the holder's process


def _mine() -> holders.Holder:
    me = holders.Holder.parse(holders.this_process())
    # the project runs on Linux (the stack, Spark's workers): /proc must be there, never a skip
    assert me is not None, "no /proc: this process could not record itself as a lease holder"
    return me


def _child(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", *argv])


def test_a_dead_holder_on_this_host_is_gone() -> None:
    _mine()
    child = _child("pass")
    recorded = holders.process_of(child.pid)
    child.wait()
    verdict = holders.judge(socket.gethostname(), recorded)
    assert verdict == holders.Verdict("gone", f"its process {child.pid} on this host is not running")


def test_a_live_holder_is_alive_and_a_reused_pid_is_gone() -> None:
    me = _mine()
    child = _child("import time; time.sleep(60)")
    try:
        recorded = holders.process_of(child.pid)
        assert holders.judge(socket.gethostname(), recorded).state == "alive"
        os.kill(child.pid, signal.SIGSTOP)  # a frozen holder is alive
        assert holders.judge(socket.gethostname(), recorded).state == "alive"
        os.kill(child.pid, signal.SIGCONT)
        # the same pid with another start time: the pid was reused by a later process
        reused = str(holders.Holder(me.boot, me.pidns, child.pid, me.start + 1))
        assert holders.judge(socket.gethostname(), reused).state == "gone"
        assert "the pid is another process's now" in holders.judge(socket.gethostname(), reused).why
    finally:
        child.kill()
        child.wait()


def test_a_zombie_holder_is_gone() -> None:
    _mine()
    child = _child("pass")
    recorded = holders.process_of(child.pid)
    deadline = time.monotonic() + 10
    while holders.judge(socket.gethostname(), recorded).state != "gone" and time.monotonic() < deadline:
        time.sleep(0.05)  # exited, not reaped (no wait() yet): a zombie
    assert holders.judge(socket.gethostname(), recorded).why.endswith("has exited")
    child.wait()


@pytest.mark.parametrize("other", ["host", "boot", "pidns", "garbage", "none"])
def test_a_holder_elsewhere_is_never_judged(other: str) -> None:
    me = _mine()
    child = _child("pass")
    child.wait()  # a pid that is gone here
    host = "another-host" if other == "host" else socket.gethostname()
    recorded: str | None = {
        "boot": str(holders.Holder("0-0", me.pidns, child.pid, 1)),
        "pidns": str(holders.Holder(me.boot, "1", child.pid, 1)),
        "garbage": "h:1:abc",
        "none": None,
    }.get(other, str(holders.Holder(me.boot, me.pidns, child.pid, 1)))
    assert holders.judge(host, recorded) == holders.UNKNOWN


def test_this_process_is_alive_and_its_pid_with_another_start_is_gone() -> None:
    me = _mine()
    assert holders.judge(socket.gethostname(), holders.this_process()).state == "alive"
    earlier = str(holders.Holder(me.boot, me.pidns, me.pid, me.start - 1))  # a process before us
    assert holders.judge(socket.gethostname(), earlier).state == "gone"
