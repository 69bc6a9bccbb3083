"""Memory and CPU of a process tree, read from /proc (Linux): the worker's Python driver, the Spark
JVM it started and the Python workers the JVM forks.

* peak RSS: the largest sum of the tree's resident sets seen by a sampler thread (every 100 ms);
* CPU seconds: the tree's user + system time, including children already reaped by a parent in the
  tree (a Python worker that exited counts in its daemon's ``cutime``);
* by role (:func:`roles`): the RSS of the driver, the JVM, PySpark's daemon and each Python worker
  now (the memory phase samples it between batches).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return text[text.rindex(")") + 2 :].split()


def tree(root: int) -> list[int]:
    """`root` and all of its descendants alive now."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name)
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / _TICK


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass
class Usage:
    peak_rss_mb: float = 0.0
    cpu_s: float = 0.0
    processes: int = 0


class Sampler:
    """``with Sampler() as usage: ...`` - the tree of this process while the body runs."""

    def __init__(self, root: int | None = None, every_s: float = 0.1) -> None:
        self.root = root or os.getpid()
        self.every_s = every_s
        self.usage = Usage()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-sampler", daemon=True)
        self._cpu0 = 0.0
        self._peak = 0
        self._seen: set[int] = set()

    def _observe(self) -> list[int]:
        pids = tree(self.root)
        self._seen.update(pids)
        self._peak = max(self._peak, rss_bytes(pids))
        return pids

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self._observe()

    def __enter__(self) -> Usage:
        self._cpu0 = cpu_seconds(self._observe())
        self._thread.start()
        return self.usage

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        pids = self._observe()
        self.usage.cpu_s = cpu_seconds(pids) - self._cpu0
        self.usage.peak_rss_mb = self._peak / 2**20
        self.usage.processes = len(self._seen)


def cmdline(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


@dataclass
class Roles:
    """The process tree of a bench worker by role: the Python driver (the root), the Spark JVM,
    PySpark's daemon and the Python workers it forked (``pyspark.daemon`` children), with each
    process's resident set in MB."""

    driver_mb: float = 0.0
    jvm_mb: float = 0.0
    daemon_mb: float = 0.0
    workers_mb: dict[int, float] = field(default_factory=dict)  # pid -> RSS MB

    @property
    def workers_total_mb(self) -> float:
        return sum(self.workers_mb.values())


def roles(root: int | None = None) -> Roles:
    """The RSS of each role in `root`'s tree now (default: this process)."""
    root = root or os.getpid()
    out = Roles()
    pids = tree(root)
    python = {pid for pid in pids if "pyspark.daemon" in cmdline(pid) or "pyspark/daemon" in cmdline(pid)}
    for pid in pids:
        mb = rss_bytes([pid]) / 2**20
        if pid == root:
            out.driver_mb = mb
        elif pid in python:
            if parent(pid) in python:
                out.workers_mb[pid] = mb  # forked by the daemon: a Python worker
            else:
                out.daemon_mb += mb
        elif "java" in cmdline(pid).split(" ", 1)[0]:
            out.jvm_mb += mb
    return out
