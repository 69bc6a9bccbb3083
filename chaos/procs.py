"""Job processes: start, watch, kill -9, and make sure nothing they spawned outlives them.

A job is ``python -m chaos.job`` in its own session; Spark's JVM and its Python daemon/workers
are its descendants (the PySpark daemon moves itself into its own process group, so a group kill
is not enough). While a job runs, its descendants are sampled from /proc with their start times;
at the end, any that are still alive (same pid AND same start time: never a recycled pid) are
killed by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JobProcess", "JobResult", "kill_if_alive"]

REPO = Path(__file__).resolve().parent.parent


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time) of `pid`, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
                starts[int(entry)] = st[1]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


@dataclass
class JobResult:
    returncode: int
    seconds: float
    log: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def last_error(self) -> str:
        lines = [line for line in self.log.splitlines() if line.startswith("chaos-job: ")]
        return lines[-1] if lines else ""


@dataclass
class JobProcess:
    """One run of the chaos job."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seen: dict[int, int] = field(default_factory=dict)

    def start(self) -> JobProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.job", *self.args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the job was not started")
        return self.proc.pid

    def sample(self) -> None:
        """Remember the descendants alive now (called while waiting)."""
        if self.proc is not None and self.proc.poll() is None:
            self.seen.update(_descendants(self.proc.pid))

    def running(self) -> bool:
        self.sample()
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """F1: SIGKILL the driver only; Spark's JVM notices its parent is gone by itself."""
        self.sample()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> JobResult:
        """Wait for the driver (bounded), then reap what it left behind; kills on timeout."""
        if self.proc is None:
            raise RuntimeError("the job was not started")
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.sample()
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.kill9()
            self.proc.wait(30)
            timed_out = True
        else:
            timed_out = False
        self._reap()
        seconds = time.monotonic() - self.started
        text = self.log_path.read_text(errors="replace")
        if timed_out:
            text += f"\nchaos-harness: TIMEOUT after {timeout_s:.0f}s, killed\n"
        return JobResult(self.proc.returncode if not timed_out else -999, seconds, text)

    def _reap(self) -> None:
        """Give the orphans (JVM, Python workers) a few seconds to exit on their own, then kill
        the ones still alive by pid."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self._alive():
            time.sleep(0.2)
        for pid in self._alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _alive(self) -> list[int]:
        alive = []
        for pid, start in self.seen.items():
            st = _stat(pid)
            if st is not None and st[1] == start and not _zombie(pid):
                alive.append(pid)
        return alive


def kill_if_alive(pid: int, start: int) -> bool:
    """SIGKILL `pid` if it is still the process that started at `start` (never a recycled pid);
    True if it was alive. A stopped process dies of SIGKILL too."""
    st = _stat(pid)
    if st is None or st[1] != start or _zombie(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def _zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return raw[raw.rfind(")") + 2 :].startswith("Z")
