"""The lab's network on two hosts of its own (own prefix: a running lab is never touched): a TCP
round trip across the bridge, a cut that leaves the connection half-open (sends succeed, nothing
arrives, the kernel retransmits), a heal that delivers the data, and a removal that leaves nothing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txn_offsets.devstack.lab import faults
from txn_offsets.devstack.lab.hosts import Host
from txn_offsets.devstack.lab.net import Network
from txn_offsets.devstack.lab.spawn import entered, plain_env, run_in, spawn_in

PORT = 5555


@pytest.fixture
def net() -> Iterator[Network]:
    assert os.geteuid() == 0, "the lab's network test needs root (network namespaces)"
    assert shutil.which("ip") and shutil.which("bridge"), "the lab's network test needs iproute2"
    network = Network(prefix=f"txo-t{os.getpid()}-", hosts=(Host("a", 11, "test"), Host("b", 12, "test")))
    assert network.leftovers() == []
    network.create()
    try:
        yield network
    finally:
        network.remove()


def test_cut_leaves_a_half_open_connection_heal_delivers_remove_leaves_nothing(net: Network) -> None:
    with entered(net, "b"):
        server = socket.create_server((net.host("b").address, PORT))
    with entered(net, "a"):
        client = socket.create_connection((net.host("b").address, PORT), timeout=5)
    conn, (peer, _) = server.accept()
    assert peer == net.host("a").address
    client.sendall(b"ping")
    conn.settimeout(5)
    assert conn.recv(4) == b"ping"  # the round trip across the bridge

    started = time.monotonic()
    at = faults.cut(net, "a")
    assert started <= at <= time.monotonic()
    assert faults.port_state(net, "a") == "disabled"
    client.sendall(b"lost?")  # half-open: the send succeeds locally
    conn.settimeout(1.5)
    with pytest.raises(TimeoutError):
        conn.recv(5)  # ... and nothing arrives
    ss = run_in(net, "a", ["ss", "-tni", "dst", net.host("b").address], timeout_s=10)
    assert ss.returncode == 0, ss.stderr
    assert "retrans:" in ss.stdout, ss.stdout  # the kernel keeps retransmitting, no RST either way

    faults.heal(net, "a")
    assert faults.port_state(net, "a") == "forwarding"
    conn.settimeout(15)
    assert conn.recv(5) == b"lost?"  # the next retransmission gets through
    for sock in (client, conn, server):
        sock.close()

    assert net.remove() == []
    assert net.leftovers() == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert net.prefix not in names


def test_isolate_freeze_and_kill_a_host(net: Network) -> None:
    a, b = net.host("a").address, net.host("b").address
    with entered(net, "b"):
        server = socket.create_server((b, PORT))
    faults.isolate(net, "a", ["b"])
    routes = run_in(net, "a", ["ip", "route", "show", "type", "blackhole"], timeout_s=10).stdout
    assert f"blackhole {b}" in routes
    # inside a, a blackhole route refuses local sends at once (EINVAL); b's packets to a arrive,
    # a's answers never leave: to b, a is silent
    with entered(net, "a"), pytest.raises(OSError, match="Invalid argument"):
        socket.create_connection((b, PORT), timeout=1.5)
    faults.rejoin(net, "a")
    assert run_in(net, "a", ["ip", "route", "show", "type", "blackhole"], timeout_s=10).stdout == ""
    with entered(net, "a"):
        socket.create_connection((b, PORT), timeout=5).close()
    server.close()

    pid = spawn_in(net, "a", ["sleep", "600"], env=plain_env(), log=Path(os.devnull), cwd=Path("/"))
    deadline = time.monotonic() + 10
    while net.pids(net.netns("a")) != [pid] and time.monotonic() < deadline:
        time.sleep(0.05)  # `ip netns exec` joins the namespace, then execs sleep
    assert net.pids(net.netns("a")) == [pid]
    faults.freeze(net, "a")
    assert proc_state(pid) == "T"
    faults.thaw(net, "a")
    assert proc_state(pid) in {"S", "R"}
    at = faults.kill_host(net, "a")
    assert at <= time.monotonic() and faults.port_state(net, "a") == "disabled"
    assert net.pids(net.netns("a")) == []
    with entered(net, "b"), pytest.raises(TimeoutError):  # a answers nothing now, not even a RST
        socket.create_connection((a, PORT), timeout=1)
    faults.heal(net, "a")
    assert faults.port_state(net, "a") == "forwarding"


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
