"""The lab's network: a switch namespace with a bridge, one namespace per host, and their removal.

The bridge lives in a namespace of its own (``<prefix>sw``), not in the machine's: the machine
gets no interface, address or route, so nothing outside the lab is ever addressed and the machine's
firewall never sees a lab frame; deleting the switch namespace removes the bridge and every veth.
:meth:`Network.leftovers` names whatever of a lab is still there (namespaces, links, /etc/netns
files, processes): ``down`` polls it until empty, ``up`` refuses to start while it is not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from txn_offsets.devstack.lab.hosts import (
    HOSTS,
    PREFIX,
    PREFIX_LEN,
    SUBNET,
    Host,
    hosts_file,
    subnet_conflict,
)
from txn_offsets.errors import StackError

__all__ = ["ETC_NETNS", "Network", "ip", "leftovers_from"]

SERVICE = "lab"
ETC_NETNS = Path("/etc/netns")
BRIDGE = "br0"


def ip(*args: str, binary: str = "ip", check: bool = True, timeout_s: float = 30) -> str:
    """Run ``ip ARGS`` (or ``bridge ARGS``) and return its stdout; a failure is a StackError naming
    the command and what it said."""
    tool = shutil.which(binary)
    if tool is None:
        raise StackError(SERVICE, f"`{binary}` (iproute2) is not installed", "install iproute2")
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        raise StackError(
            SERVICE,
            f"`{binary} {' '.join(args)}` failed: {done.stderr.strip()[-300:]}",
            "the lab needs root and network namespaces (`ip netns`); run `make lab-down` and try again",
        )
    return done.stdout


def leftovers_from(
    prefix: str,
    netns_list: str,
    links: str,
    etc_names: Iterable[str],
    pids: Mapping[str, Iterable[int]],
) -> list[str]:
    """What of a lab with this `prefix` is still there, one readable item each, from
    ``ip netns list``, ``ip -br link`` (the machine's own links), the names in /etc/netns and the
    pids found in each namespace (or by the lab's marker: key ``marked``)."""
    found = []
    for line in netns_list.splitlines():
        name = line.split(" ", 1)[0].strip()
        if name.startswith(prefix):
            found.append(f"namespace {name}")
    for line in links.splitlines():
        name = line.split(" ", 1)[0].split("@", 1)[0].strip()
        if name.startswith(prefix):
            found.append(f"link {name}")
    found += [f"/etc/netns/{name}" for name in sorted(etc_names) if name.startswith(prefix)]
    for where, numbers in sorted(pids.items()):
        if listed := sorted(set(numbers)):
            found.append(f"processes {', '.join(map(str, listed))} ({where})")
    return found


class Network:
    """The namespaces and bridge of one lab: `prefix` names them all (tests use one of their own)."""

    def __init__(self, prefix: str = PREFIX, hosts: tuple[Host, ...] = HOSTS) -> None:
        self.prefix = prefix
        self.hosts = hosts

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def netns(self, host: Host | str) -> str:
        return f"{self.prefix}{host if isinstance(host, str) else host.name}"

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise StackError(
            SERVICE, f"no lab host {name!r}", f"use one of {', '.join(h.name for h in self.hosts)}"
        )

    def check_subnet(self) -> None:
        """Refuse a subnet the machine already uses (its own address or a connected network)."""
        tool = shutil.which("ip") or "ip"
        done = subprocess.run(
            [tool, "route", "get", f"{SUBNET}.1"], capture_output=True, text=True, check=False
        )
        problem = subnet_conflict(done.stdout or done.stderr)
        if problem:
            raise StackError(
                SERVICE,
                f"the lab's subnet {SUBNET}.0/{PREFIX_LEN} is in use on this machine: {problem}",
                "remove that network, or change txn_offsets.devstack.lab.hosts.SUBNET",
            )

    def create(self) -> None:
        """The switch with its bridge, then each host: its namespace, veth pair, address and names."""
        sw = self.switch
        ip("netns", "add", sw)
        ip("-n", sw, "link", "set", "lo", "up")
        ip("-n", sw, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", sw, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            ns = self.netns(host)
            ip("netns", "add", ns)
            ip("-n", sw, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", sw, "link", "set", host.port, "master", BRIDGE, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            etc = ETC_NETNS / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file(host, socket.gethostname(), self.hosts))

    def namespaces(self) -> list[str]:
        """This lab's namespaces that exist now."""
        names = (line.split(" ", 1)[0] for line in ip("netns", "list").splitlines())
        return [n for n in names if n.startswith(self.prefix)]

    def pids(self, ns: str) -> list[int]:
        """The processes in namespace `ns` (none if it does not exist); never this one."""
        out = ip("netns", "pids", ns, check=False)
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    def kill_all(self, ns: str, timeout_s: float = 20) -> None:
        """SIGKILL every process in `ns`, again and again until none is left (one may fork while
        the others die)."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids(ns):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise StackError(SERVICE, f"processes {pids} in {ns} survive SIGKILL", "look at them with ps")
            time.sleep(0.05)

    def remove(self, marker: str | None = None, timeout_s: float = 30) -> list[str]:
        """Kill every process of the lab (in its namespaces; also any whose command line holds
        `marker`), delete the namespaces (hosts first, the switch last) and /etc/netns entries, and
        wait until :meth:`leftovers` is empty; returns what is still left after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in marked_pids(marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            names = self.namespaces()
            for ns in sorted(names, key=lambda n: n == self.switch):
                self.kill_all(ns)
                ip("netns", "del", ns, check=False)
            for path in ETC_NETNS.glob(f"{self.prefix}*"):
                shutil.rmtree(path, ignore_errors=True)
            left = self.leftovers(marker)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)  # deleting a namespace is asynchronous: its veth lingers a moment

    def leftovers(self, marker: str | None = None) -> list[str]:
        """What of this lab is still there (empty once it is removed)."""
        names = self.namespaces()
        pids: dict[str, list[int]] = {ns: self.pids(ns) for ns in names}
        pids["marked"] = marked_pids(marker)
        etc = [p.name for p in ETC_NETNS.iterdir()] if ETC_NETNS.is_dir() else []
        return leftovers_from(self.prefix, ip("netns", "list"), ip("-br", "link"), etc, pids)


def marked_pids(marker: str | None) -> list[int]:
    """Live processes outside the machine's network namespace whose command line contains `marker`
    (a lab's processes whose namespace is already deleted); none without a marker. A process of
    the machine's own (an editor, a `tail -f` of a lab log) is never one."""
    if not marker:
        return []
    machine = os.readlink(f"/proc/{os.getpid()}/ns/net")  # ours: the machine's (pid 1 may be hidden)
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        pid = int(cmdline.parent.name)
        with contextlib.suppress(OSError):
            mine = pid != os.getpid() and marker.encode() in cmdline.read_bytes()
            if mine and os.readlink(f"/proc/{pid}/ns/net") != machine:  # a zombie has none: OSError
                found.append(pid)
    return found
