"""Process bookkeeping for the embedded stack: pid files, liveness, free ports, stopping by pid."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from txn_offsets.errors import StackError

logger = logging.getLogger(__name__)

# Services we started from this interpreter. Holding the Popen objects keeps Python from warning that
# a child "is still running" when the object is collected, and lets stop_pid reap the exit status.
_children: dict[int, subprocess.Popen[bytes]] = {}


def adopt(proc: subprocess.Popen[bytes]) -> None:
    """Remember a long-running child so it can be reaped when stopped."""
    _children[proc.pid] = proc


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (zombies count as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # 'Z' is a zombie that only waits to be reaped
    return proc_state(pid) != "Z"


def proc_state(pid: int) -> str | None:
    """The process's state letter (field 3 of /proc/<pid>/stat: R, S, D, T, Z...), None when it
    cannot be read (the process is gone)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return None


def cmdline(pid: int) -> str:
    """The process's command line joined by spaces, or '' if it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def read_pid(pid_file: Path, service: str, marker: str, *, keep_stale: bool = False) -> int | None:
    """The pid of our running process, or None; a stale pid file (dead process) is removed, unless
    `keep_stale` (``dev status`` only reports: it changes nothing).

    `marker` is a string our process's command line must contain; a live process without it means
    the pid was reused by something else, and we refuse to guess.
    """
    if not pid_file.exists():
        return None
    text = pid_file.read_text().strip().splitlines()
    try:
        pid = int(text[0])
    except (IndexError, ValueError):
        raise StackError(
            service, f"pid file {pid_file} is unreadable", f"remove {pid_file} and run `make stack-up` again"
        ) from None
    if not pid_alive(pid):
        if keep_stale:
            return None
        logger.warning("removing stale pid file %s (process %d is gone)", pid_file, pid)
        pid_file.unlink()
        return None
    if marker not in cmdline(pid):
        raise StackError(
            service,
            f"pid file {pid_file} names process {pid}, which is not ours ({cmdline(pid)[:80]!r})",
            f"the pid file is stale: remove {pid_file} and run `make stack-up` again",
        )
    return pid


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) != 0


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel considers free right now on host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def require_port_free(service: str, port: int, setting: str, host: str = "127.0.0.1") -> None:
    """Raise a clear error if something already listens on the port we are about to use."""
    if not port_free(port, host):
        raise StackError(
            service,
            f"port {host}:{port} is already in use by another process",
            f"stop that process (see `ss -ltnp 'sport = :{port}'`) or choose another port with {setting}",
        )


def stop_pid(pid: int, *, timeout_s: float = 30.0) -> None:
    """SIGTERM the process and wait; SIGKILL it if it does not exit in time."""
    try:
        _stop(pid, timeout_s)
    finally:
        child = _children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)


def _stop(pid: int, timeout_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    logger.warning("process %d did not stop in %.0fs; killing it", pid, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
