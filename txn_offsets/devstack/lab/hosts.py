"""The lab's hosts: names, addresses, roles, and the names file every host resolves them with.

Each host is a network namespace ``<prefix><name>`` (prefix ``txo-``) with one interface, ``eth0``,
addressed ``10.47.45.<octet>/24``, whose other end is the port ``p<octet>`` of the bridge in the
switch namespace ``<prefix>sw``. Nothing here touches the machine: the functions are pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "HOSTS",
    "PREFIX",
    "SUBNET",
    "Host",
    "by_name",
    "hosts_file",
    "subnet_conflict",
]

PREFIX = "txo-"
#: the lab's /24 (first three octets); never routed on the machine itself (:func:`subnet_conflict`)
SUBNET = "10.47.45"
PREFIX_LEN = 24


@dataclass(frozen=True)
class Host:
    """One lab host: its name (also its namespace's, after the prefix), last octet and role."""

    name: str
    octet: int
    role: str  # kafka | postgres | spark-master | spark-worker | driver

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.octet}"

    @property
    def port(self) -> str:
        """Its port on the switch's bridge (interface names are at most 15 characters)."""
        return f"p{self.octet}"


HOSTS: tuple[Host, ...] = (
    Host("kafka-1", 11, "kafka"),
    Host("kafka-2", 12, "kafka"),
    Host("kafka-3", 13, "kafka"),
    Host("pg-1", 21, "postgres"),
    Host("pg-2", 22, "postgres"),
    Host("spark-master", 31, "spark-master"),
    Host("worker-1", 32, "spark-worker"),
    Host("worker-2", 33, "spark-worker"),
    Host("driver", 41, "driver"),
    Host("driver-2", 42, "driver"),  # a second driver host: a job restarted elsewhere (chaos L8)
)


def by_name(name: str, hosts: tuple[Host, ...] = HOSTS) -> Host:
    """The host called `name`; a KeyError naming the known ones otherwise."""
    for host in hosts:
        if host.name == name:
            return host
    raise KeyError(f"no lab host {name!r} (hosts: {', '.join(h.name for h in hosts)})")


def hosts_file(own: Host, machine: str, hosts: tuple[Host, ...] = HOSTS) -> str:
    """The /etc/hosts lab host `own` sees (``ip netns exec`` bind-mounts /etc/netns/<ns>/hosts): the
    lab's names, and the machine's host name `machine` (every host shares it) as `own`'s address, so
    a program that resolves its own host name (Java's getLocalHost) finds itself, as on a real one."""
    lines = ["127.0.0.1 localhost", *(f"{h.address} {h.name}" for h in hosts)]
    if machine and machine not in {h.name for h in hosts} | {"localhost"}:
        lines.append(f"{own.address} {machine}")
    return "\n".join(lines) + "\n"


def subnet_conflict(route_get: str) -> str | None:
    """Why the lab's subnet cannot be used here, from ``ip route get <SUBNET>.1``'s output; None when
    the machine would send it to its default gateway (nothing local uses the subnet). A connected or
    local route means a network of this machine already has those addresses."""
    text = route_get.strip().removeprefix("RTNETLINK answers: ")
    if not text:
        return "`ip route get` answered nothing"
    if text.lower().startswith("network is unreachable"):
        return None  # no route at all (not even a default one): nothing local uses it
    if text.startswith(("local ", "broadcast ")):
        return f"the address is local to this machine ({text.splitlines()[0]})"
    if re.search(r"\bvia\b", text.splitlines()[0]):
        return None
    if text.startswith(("unreachable", "prohibit", "blackhole")):
        return None  # no route at all: nothing local uses it either
    return f"a network of this machine is connected to it ({text.splitlines()[0]})"
