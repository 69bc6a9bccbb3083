"""PostgreSQL on the lab's pg hosts: a primary on pg-1, its streaming replica on pg-2, PgBouncer on pg-1.

The devstack's own starters (:mod:`..postgres`, :mod:`..replica`, :mod:`..pgbouncer`) run inside each
host's network namespace (:func:`.spawn.entered`): the servers listen on their host's address only,
accept the lab's subnet (scram-sha-256) and replicate across the bridge.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import time
from pathlib import Path

from txn_offsets.devstack import pgbouncer, postgres
from txn_offsets.devstack import replica as standby
from txn_offsets.devstack._proc import cmdline, pid_alive, read_pid
from txn_offsets.devstack.lab.hosts import PREFIX_LEN, SUBNET
from txn_offsets.devstack.lab.net import Network
from txn_offsets.devstack.lab.spawn import entered
from txn_offsets.errors import StackError

__all__ = ["BOUNCER_PORT", "PORT", "Servers", "remove_data"]

PORT = 5432
BOUNCER_PORT = 6432
PRIMARY, REPLICA = "pg-1", "pg-2"


class Servers:
    """The lab's PostgreSQL pair and pooler, files under ``run_dir/<host>``."""

    def __init__(self, net: Network, run_dir: Path) -> None:
        self.net = net
        clients = f"{SUBNET}.0/{PREFIX_LEN}"
        self.primary = postgres.cluster_for(
            run_dir / PRIMARY, PORT, host=net.host(PRIMARY).address, clients=clients
        )
        self.replica = postgres.cluster_for(
            run_dir / REPLICA, PORT, host=net.host(REPLICA).address, clients=clients
        )
        self.bouncer = pgbouncer.Bouncer(
            home=pgbouncer.home_for(run_dir / PRIMARY / "pgbouncer", self.primary.os_user),
            pid_file=run_dir / PRIMARY / "pgbouncer.pid",
            port=BOUNCER_PORT,
            upstream_host=self.primary.host,
            upstream_port=PORT,
            os_user=self.primary.os_user,
            admin_user=postgres.ADMIN_USER,
            listen_host=net.host(PRIMARY).address,
        )

    def start(self, admin_password: str, app_password: str, run_password: str) -> None:
        """Primary (roles, database), then the replica streaming from it, then PgBouncer; each
        waits until it answers (the replica: until the primary sees it streaming)."""
        for cluster in (self.primary, self.replica):
            cluster.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with entered(self.net, PRIMARY):
            postgres.start(self.primary, admin_password, app_password, run_password)
        with entered(self.net, REPLICA):
            standby.start(self.primary, self.replica, admin_password)
        with entered(self.net, PRIMARY):
            admin = postgres.admin_conninfo(self.primary, admin_password, postgres.APP_DB)
            roles = [postgres.APP_USER, postgres.RUN_USER, postgres.ADMIN_USER]
            pgbouncer.start(self.bouncer, admin, roles)

    def quit(self, timeout_s: float = 5) -> None:
        """Immediate shutdown of both servers (SIGCONT, then SIGQUIT to each postmaster: it still
        removes its System V shared memory segment, which a SIGKILL would leave behind), waiting up
        to `timeout_s`; a server that does not exit is left for the SIGKILL that follows."""
        alive = []
        for cluster in (self.replica, self.primary):
            pid = postgres._postmaster_pid(cluster)
            if pid is not None and pid_alive(pid) and str(cluster.data_dir) in cmdline(pid):
                alive.append(pid)
        for pid in alive:
            for sig in (signal.SIGCONT, signal.SIGQUIT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while any(pid_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)

    def pids(self) -> dict[str, int | None]:
        """Each server's pid from its pid file (None: not running); changes nothing."""
        found: dict[str, int | None] = {}
        for name, pid_file, marker in (
            (f"postgres {PRIMARY}", self.primary.pid_file, self.primary.data_dir),
            (f"replica {REPLICA}", self.replica.pid_file, self.replica.data_dir),
            (f"pgbouncer {PRIMARY}", self.bouncer.pid_file, self.bouncer.config),
        ):
            try:
                found[name] = read_pid(pid_file, name, str(marker), keep_stale=True)
            except StackError:  # the pid now names another process
                found[name] = None
        return found


def remove_data(run_dir: Path) -> None:
    """Remove the servers' data kept outside `run_dir` (when their OS user cannot enter it: the
    devstack then keeps it under /var/lib/txn-offsets/<digest>)."""
    for name in (PRIMARY, REPLICA):
        for sub in ("postgres", "pgbouncer"):
            where = run_dir / name if sub == "postgres" else run_dir / name / "pgbouncer"
            digest = hashlib.sha256(str(where).encode()).hexdigest()[:12]
            shutil.rmtree(Path("/var/lib/txn-offsets") / digest, ignore_errors=True)
