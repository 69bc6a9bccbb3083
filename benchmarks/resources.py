"""Memory and CPU of a process tree, read from /proc (Linux): the worker's Python driver, the Spark
JVM it started and the Python workers the JVM forks.

* peak RSS: the largest sum of the tree's resident sets seen by a sampler thread (every 100 ms);
* CPU seconds: the tree's user + system time, including children already reaped by a parent in the
  tree (a Python worker that exited counts in its daemon's ``cutime``);
* by role (:func:`roles`): the RSS of the driver, the JVM, PySpark's daemon and each Python worker
  now (the memory phase samples it between batches);
* CPU seconds by role (:func:`cpu_by_role`): the driver, the Spark JVM, the Python workers and
  each service of the stack (PostgreSQL, the broker, PgBouncer), read before and after a run
  (benchmarks/user_scale.py: where a batch's CPU goes on a machine whose cores they all share).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
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


def _all_stats() -> dict[int, list[str]]:
    """The stat fields of every process alive now (one pass over /proc)."""
    out: dict[int, list[str]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                out[int(entry.name)] = fields
    return out


def _descendants(stats: dict[int, list[str]], root: int) -> list[int]:
    """`root` and all of its descendants in `stats` (:func:`_all_stats`)."""
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree(root: int) -> list[int]:
    """`root` and all of its descendants alive now."""
    return _descendants(_all_stats(), root)


def _seconds(fields: list[str], *, reaped: bool = True) -> float:
    """CPU seconds in one process's stat fields: utime + stime (fields 14-15 of stat, 11-12 after
    the name), and with `reaped` its reaped children's cutime + cstime (16-17)."""
    return sum(int(f) for f in fields[11 : 15 if reaped else 13]) / _TICK


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += _seconds(fields)
    return total


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


def _is_pyspark_daemon(command: str) -> bool:
    return "pyspark.daemon" in command or "pyspark/daemon" in command


def _is_java(command: str) -> bool:
    return "java" in command.split(" ", 1)[0]


def roles(root: int | None = None) -> Roles:
    """The RSS of each role in `root`'s tree now (default: this process)."""
    root = root or os.getpid()
    out = Roles()
    pids = tree(root)
    python = {pid for pid in pids if _is_pyspark_daemon(cmdline(pid))}
    for pid in pids:
        mb = rss_bytes([pid]) / 2**20
        if pid == root:
            out.driver_mb = mb
        elif pid in python:
            if parent(pid) in python:
                out.workers_mb[pid] = mb  # forked by the daemon: a Python worker
            else:
                out.daemon_mb += mb
        elif _is_java(cmdline(pid)):
            out.jvm_mb += mb
    return out


#: the roles of :func:`cpu_by_role` in this process's tree, after which come the services'
TREE_ROLES = ("driver", "spark_jvm", "python_workers", "other")


def cpu_by_role(services: Mapping[str, int | None], root: int | None = None) -> dict[str, float]:
    """CPU seconds used so far by each role: in `root`'s tree (default: this process) the driver
    (`root` alone, its threads included), the Spark JVM, the Python workers (PySpark's daemon and
    the workers it forked, reaped ones included: they count in the daemon's children's time) and
    anything else; then each of `services` (name -> the pid of its root process, None: not
    running) with its whole tree (a PostgreSQL backend that ended counts in the postmaster's
    children's time). Two readings, before and after a run, give the run's CPU by role
    (:func:`used`); a process that started and ended between them is not seen, except where its
    parent in the tree reaped it."""
    root = root or os.getpid()
    stats = _all_stats()  # one reading of /proc for every tree below
    out = dict.fromkeys(TREE_ROLES, 0.0)
    served = {name: _descendants(stats, pid) if pid is not None else [] for name, pid in services.items()}
    theirs = {pid for pids in served.values() for pid in pids}
    for pid in _descendants(stats, root):
        fields = stats.get(pid)
        if fields is None or pid in theirs:  # a service this process started counts as that service only
            continue
        if pid == root:
            out["driver"] += _seconds(fields, reaped=False)
            continue
        command = cmdline(pid)
        if _is_pyspark_daemon(command):
            role = "python_workers"
        elif _is_java(command):
            role = "spark_jvm"
        else:
            role = "other"
        # a process's reaped children count where it counts (the daemon's workers, a shell's java)
        out[role] += _seconds(fields)
    for name, pids in served.items():
        out[name] = sum(_seconds(stats[pid]) for pid in pids if pid in stats)
    return out


def stack_services() -> dict[str, int | None]:
    """The root pids of the local stack's services (``TXN_OFFSETS_STACK_DIR``, as `make stack-up`
    exports it): {} when there is no such stack here (a remote PostgreSQL or Kafka is not read)."""
    where = os.environ.get("TXN_OFFSETS_STACK_DIR")
    if not where or not Path(where).is_dir():
        return {}
    from txn_offsets.devstack import Stack
    from txn_offsets.errors import StackError

    try:
        status = Stack(Path(where)).status()
    except (StackError, OSError, ValueError, KeyError):
        return {}
    return {"postgres": status.postgres_pid, "kafka": status.kafka_pid, "pgbouncer": status.pgbouncer_pid}


def used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The CPU seconds each role used between two :func:`cpu_by_role` readings (never negative: a
    process gone between them takes its seconds with it)."""
    return {role: max(0.0, after[role] - before.get(role, 0.0)) for role in after}
