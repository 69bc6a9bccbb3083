"""The faults of a real cluster, done to lab hosts: cut off, partly isolated, frozen, killed.

Each returns the monotonic time (``time.monotonic()``) at which it took effect, read back from the
kernel where it can be, so a scenario measures recovery from the fault itself.

- :func:`cut` / :func:`heal`: the host's bridge port disabled / forwarding (``bridge link set
  state``; ``ip link set ... type bridge_slave state`` is silently ignored by iproute2 6.1, so the
  state is read back). Both directions, silently, carrier up: a partition, not a cable pull. A TCP
  connection across it is half-open: sends succeed, nothing arrives, no RST either way.
- :func:`isolate` / :func:`rejoin`: blackhole routes inside the host to the given hosts (a broker
  cut from the other brokers while clients still reach it).
- :func:`freeze` / :func:`thaw`: SIGSTOP / SIGCONT every process of the host (its kernel still
  acknowledges TCP and answers keepalives: a frozen driver keeps its sessions open).
- :func:`kill_host`: a machine lost: cut first (a dead machine sends no FIN or RST), then SIGKILL
  every process until none is left; :func:`kill_processes` alone is a crash of its software.
No netem, no iptables: two iproute2 mechanisms cover them all on any kernel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from txn_offsets.devstack._proc import proc_state
from txn_offsets.devstack.lab.net import Network, ip
from txn_offsets.errors import StackError

__all__ = ["cut", "freeze", "heal", "isolate", "kill_host", "kill_processes", "port_state", "rejoin", "thaw"]

SERVICE = "lab"
_STATES = {"disabled": "0", "forwarding": "3"}


def port_state(net: Network, name: str) -> str:
    """The host's bridge port state as the kernel reports it (forwarding, disabled, ...)."""
    port = net.host(name).port
    out = ip("-n", net.switch, "link", "show", "dev", port, binary="bridge")
    words = out.split()
    return words[words.index("state") + 1] if "state" in words else "unknown"


def _set_port(net: Network, name: str, state: str) -> float:
    port = net.host(name).port
    ip("-n", net.switch, "link", "set", "dev", port, "state", _STATES[state], binary="bridge")
    got = port_state(net, name)
    if got != state:
        raise StackError(SERVICE, f"{name}'s bridge port {port} is {got}, not {state}", "run `make lab-down`")
    return time.monotonic()


def cut(net: Network, name: str) -> float:
    """Host `name` cut off from every other host, both ways, silently."""
    return _set_port(net, name, "disabled")


def heal(net: Network, name: str) -> float:
    """Host `name` reachable again (its bridge port forwarding)."""
    return _set_port(net, name, "forwarding")


def isolate(net: Network, name: str, from_hosts: Iterable[str]) -> float:
    """Host `name` cannot reach `from_hosts` (blackhole routes inside it: what it sends to them is
    dropped, so neither side hears the other); every other host still reaches it."""
    ns = net.netns(net.host(name))
    for other in from_hosts:
        ip("-n", ns, "route", "replace", "blackhole", f"{net.host(other).address}/32")
    return time.monotonic()


def rejoin(net: Network, name: str, from_hosts: Iterable[str] | None = None) -> float:
    """Undo :func:`isolate` (for `from_hosts`, default all of them)."""
    ns = net.netns(net.host(name))
    if from_hosts is None:
        routes = ip("-n", ns, "route", "show", "type", "blackhole").split("\n")
        targets = [line.split()[1] for line in routes if line.split()[:1] == ["blackhole"]]
    else:
        targets = [f"{net.host(other).address}/32" for other in from_hosts]
    for target in targets:
        ip("-n", ns, "route", "del", "blackhole", target, check=False)
    return time.monotonic()


#: how long freeze waits for its processes to stop
STOP_WAIT_S = 10.0
_STOPPED = {"T", "t", None}  # stopped (by a signal, or traced), or gone


def _signal_all(net: Network, name: str, sig: signal.Signals) -> float:
    ns = net.netns(net.host(name))
    done: set[int] = set()
    while todo := [p for p in net.pids(ns) if p not in done]:  # until a pass finds no new process
        for pid in todo:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            done.add(pid)
    return time.monotonic()


def freeze(net: Network, name: str) -> float:
    """Every process of host `name` stopped (SIGSTOP); returns when it signalled them, once each
    is stopped or gone (at most STOP_WAIT_S later). A process takes SIGSTOP when it next runs -
    on a busy machine, or in uninterruptible sleep, not at once: CI saw one still in D state."""
    at = _signal_all(net, name, signal.SIGSTOP)
    ns = net.netns(net.host(name))
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and any(proc_state(p) not in _STOPPED for p in net.pids(ns)):
        time.sleep(0.01)
    return at


def thaw(net: Network, name: str) -> float:
    """Every process of host `name` running again (SIGCONT)."""
    return _signal_all(net, name, signal.SIGCONT)


def kill_processes(net: Network, name: str) -> float:
    """SIGKILL every process of host `name` until none is left (its sockets still say goodbye)."""
    net.kill_all(net.netns(net.host(name)))
    return time.monotonic()


def kill_host(net: Network, name: str) -> float:
    """Host `name` lost: cut off, then every process killed; returns when it was cut (from then on
    it answers nothing). :func:`heal` it before starting anything there again."""
    at = cut(net, name)
    kill_processes(net, name)
    return at
