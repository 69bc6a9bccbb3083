"""Running things on a lab host: its network namespace, and a worker host's file-system view.

Three ways in, by what the caller needs:
- :func:`entered`: this thread joins the host's network namespace for the block (``setns``): the
  devstack's own PostgreSQL/PgBouncer/Kafka starters run unchanged inside it (their children inherit
  it), and readiness probes connect from the driver host.
- :func:`spawn_in` / :func:`run_in`: a command through ``ip netns exec``, which also gives it the
  host's /etc/hosts (``/etc/netns/<ns>/hosts``: the lab's names) and a private mount namespace.
- with a :class:`View` (worker hosts): in that private mount namespace, the pyspark distribution is
  bind-mounted read-only to the lab's ``spark-home`` and empty tmpfs are mounted over the checkout's
  ``txn_offsets``, the venv and the build interpreter's prefix, then the command is exec'd. All hosts
  share one disk; without the view a worker would find txn_offsets where the driver has it and the
  lab would prove nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from txn_offsets.devstack._proc import adopt
from txn_offsets.devstack.lab.net import Network
from txn_offsets.errors import StackError

__all__ = ["NODE_PYTHON_VARIABLE", "View", "entered", "hidden_paths", "node_python", "run_in", "spawn_in"]

SERVICE = "lab"
CLONE_NEWNET = 0x40000000
NODE_PYTHON_VARIABLE = "LAB_NODE_PYTHON"
#: a worker host's environment starts from this, not from the caller's (no venv on PATH)
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python >= 3.12
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def entered(net: Network, name: str) -> Iterator[None]:
    """This thread in host `name`'s network namespace for the block (root only); processes it
    starts meanwhile stay there. Other threads are not moved."""
    ns = net.netns(net.host(name))
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    except FileNotFoundError:
        raise StackError(
            SERVICE, f"host {name} does not exist (no namespace {ns})", "run `make lab-up`"
        ) from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


@dataclass(frozen=True)
class View:
    """A worker host's file system: `spark_dist` shown read-only at `spark_home`, `hidden` emptied."""

    spark_dist: Path
    spark_home: Path
    hidden: tuple[Path, ...] = field(default_factory=tuple)

    def script(self) -> str:
        """The ``sh -c`` script that builds the view and execs its arguments."""
        quote = shlex.quote
        steps = ["set -e", f"mount --bind -o ro {quote(str(self.spark_dist))} {quote(str(self.spark_home))}"]
        steps += [f"mount -t tmpfs -o ro,size=4k none {quote(str(p))}" for p in self.hidden if p.is_dir()]
        return "; ".join([*steps, 'exec "$@"'])


def hidden_paths(node_python: str, also: Sequence[Path] = ()) -> tuple[Path, ...]:
    """What a worker host must not see: this txn_offsets package, this venv and the interpreter it
    was built from (unless the nodes' Python lives there: then only the venv); in a checkout also
    its ``build/`` and ``dist/`` (the job environment's venv and archive); and `also`."""
    package = Path(__file__).resolve().parents[2]  # this txn_offsets (the checkout's, when editable)
    hidden = [package, Path(sys.prefix).resolve()]
    if (package.parent / "pyproject.toml").is_file():
        hidden += [package.parent / "build", package.parent / "dist"]
    hidden += [Path(p).resolve() for p in also]
    base = Path(sys.base_prefix).resolve()
    if not Path(node_python).resolve().is_relative_to(base):
        hidden.append(base)
    return tuple(dict.fromkeys(hidden))


def _argv(net: Network, name: str, argv: Sequence[str], view: View | None) -> list[str]:
    ns = net.netns(net.host(name))
    wrapped = ["sh", "-c", view.script(), "lab-view", *argv] if view is not None else list(argv)
    return ["ip", "netns", "exec", ns, *wrapped]


def plain_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A host's environment: a plain PATH, HOME, a locale, then `extra`."""
    base = {"PATH": PLAIN_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    return {**base, **(extra or {})}


def spawn_in(
    net: Network,
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    cwd: Path,
    view: View | None = None,
) -> int:
    """Start a long-running service on host `name` (its own session, output to `log`); its pid
    (``ip netns exec`` and the view's ``sh`` exec it: the pid is the service's)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            _argv(net, name, argv, view),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    adopt(proc)
    return proc.pid


def run_in(
    net: Network,
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    view: View | None = None,
    timeout_s: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command on host `name` and wait for it (the driver: spark-submit, a probe); its
    output captured, its exit code not checked. `env` replaces the environment (default: ours)."""
    done: subprocess.CompletedProcess[str] = subprocess.run(  # noqa: PLW1510 - the caller checks
        _argv(net, name, argv, view),
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=timeout_s,
        cwd=cwd,
    )
    return done


def node_python() -> str:
    """The worker hosts' Python: $LAB_NODE_PYTHON, default /usr/bin/python3; its minor version
    must be the driver's (PySpark refuses a worker/driver mismatch)."""
    chosen = os.environ.get(NODE_PYTHON_VARIABLE) or "/usr/bin/python3"
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        done = subprocess.run(
            [chosen, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        got = done.stdout.strip() if done.returncode == 0 else f"not runnable ({done.stderr.strip()[-100:]})"
    except OSError as exc:
        got = f"not runnable ({exc.strerror})"
    if got != want:
        raise StackError(
            SERVICE,
            f"the worker hosts' Python {chosen} is {got}, the driver's is {want}",
            f"set {NODE_PYTHON_VARIABLE} to a plain python{want} outside the venv (one without txn_offsets)",
        )
    return chosen
