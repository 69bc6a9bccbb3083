"""Which process holds a run's lease, and whether it is provably gone.

A run's start records its process (``jobs.run_process``) beside its host (``jobs.run_host``): the
kernel's boot id, the pid namespace, the pid and the process's start time in clock ticks since
boot (``/proc/<pid>/stat``, field 22). A pid alone proves nothing - pids are reused - but a pid with
its start time names one process for the life of a boot, and comparing ticks with ticks needs no
clock: neither this host's wall clock nor the database's.

A holder is judged only from the same host, the same boot and the same pid namespace (a container
sees other pids than its host): it is gone when no process has its pid, when the process with its
pid started at another time (the pid was reused), or when it has exited and waits to be reaped (a
zombie runs no code). Anything else - another host, another container, a process this user may not
look at, no ``/proc`` (not Linux) - is never judged: the lease is left to expire.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["UNKNOWN", "Holder", "Verdict", "judge", "process_of", "this_process"]

_PROC = Path("/proc")


@dataclass(frozen=True)
class Holder:
    """A process as a lease records it: ``boot/pidns/pid/start``."""

    boot: str  # /proc/sys/kernel/random/boot_id: new at every boot
    pidns: str  # the inode of /proc/<pid>/ns/pid: the namespace the pid is numbered in
    pid: int
    start: int  # clock ticks since boot when the process started

    def __str__(self) -> str:
        return f"{self.boot}/{self.pidns}/{self.pid}/{self.start}"

    @classmethod
    def parse(cls, text: str | None) -> Holder | None:
        """The holder recorded as `text` (None: none recorded, or not in this shape)."""
        parts = (text or "").split("/")
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))


def this_process() -> str | None:
    """This process as a run's start records it (None: not on Linux, or /proc unreadable)."""
    return _this(os.getpid())


@functools.cache
def _this(pid: int) -> str | None:
    # cached per pid: a forked child is another process and computes its own
    return process_of(pid)


def process_of(pid: int) -> str | None:
    """The process `pid` as a run's start records it (None: not on Linux, /proc unreadable)."""
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        pidns = _pidns(str(pid))
        start = _stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return None
    return str(Holder(boot, pidns, pid, start))


def _pidns(pid: str) -> str:
    link = os.readlink(_PROC / pid / "ns" / "pid")  # "pid:[4026531836]"
    return link.removeprefix("pid:[").removesuffix("]")


def _stat(pid: int) -> tuple[str, int]:
    """The state letter and start time (ticks since boot) of `pid`, from /proc/<pid>/stat."""
    text = (_PROC / str(pid) / "stat").read_text()
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # field 3 (state) and field 22 (starttime)


@dataclass(frozen=True)
class Verdict:
    """What this host can tell of a lease holder: ``gone`` (with why, e.g. "its process 4121 on
    this host is not running"), ``alive`` (the same process runs here now) or ``unknown``."""

    state: Literal["gone", "alive", "unknown"]
    why: str = ""


UNKNOWN = Verdict("unknown")


def judge(host: str | None, recorded: str | None) -> Verdict:
    """The holder `recorded` on `host`, judged from this process (see the module): gone only when
    provably so; another host, boot or pid namespace is never judged."""
    holder = _judgeable(host, recorded)
    if holder is None:
        return UNKNOWN
    pid = holder.pid
    try:
        seen = _seen(pid)
    except LookupError:
        return UNKNOWN
    if seen is None:
        return Verdict("gone", f"its process {pid} on this host is not running")
    state, start = seen
    if start != holder.start:
        return Verdict("gone", f"its process {pid} on this host ended (the pid is another process's now)")
    if state in ("Z", "X"):
        return Verdict("gone", f"its process {pid} on this host has exited")
    return Verdict("alive", f"its process {pid} is running on this host")


def _judgeable(host: str | None, recorded: str | None) -> Holder | None:
    """The holder `recorded`, if this process may judge it by its pid: the same host, boot and pid
    namespace (this very process is judged like any other: alive, or its pid reused by us)."""
    holder = Holder.parse(recorded)
    mine = Holder.parse(this_process())
    if holder is None or mine is None or host != socket.gethostname():
        return None
    if (holder.boot, holder.pidns) != (mine.boot, mine.pidns):
        return None
    return holder


def _seen(pid: int) -> tuple[str, int] | None:
    """The state and start time of the process `pid`, or None when there is none; LookupError
    when this process cannot tell (another user's process hidden by /proc's hidepid, no /proc)."""
    if not _exists(pid):
        return None
    try:
        return _stat(pid)
    except FileNotFoundError:  # ended since, or hidden from us
        if not _exists(pid):
            return None
        raise LookupError(pid) from None
    except (OSError, ValueError, IndexError):
        raise LookupError(pid) from None


def _exists(pid: int) -> bool:
    """Whether a process has `pid` (signal 0: nothing is sent); True when we cannot tell."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process, which exists
        return True
    return True
