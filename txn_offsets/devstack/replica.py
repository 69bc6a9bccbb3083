"""A streaming replica beside a PostgreSQL primary, and the failover tools of the chaos suite.

``txn-offsets dev up --replica`` (``make stack-up REPLICA=1``) starts a hot standby of the stack's
PostgreSQL: ``pg_basebackup -R`` (asynchronous streaming replication, no slot), on its own loopback
port, as the same OS user; its URL and a libpq multi-host URL over both servers
(``host=primary,replica`` with ``target_session_attrs=read-write``: libpq connects to whichever
one takes writes) go to ``.stack/env``. The chaos suite's failover faults (F15-F17) run a
:class:`Pair` of their own in their work directory on free ports instead, so killing and promoting
never touches the stack's PostgreSQL. :func:`promote` is ``pg_ctl promote``: what Patroni (or a
managed service's HA) does to the clients' view of the cluster, without the consensus around it.

The replication connection authenticates with a passfile (0600, the server's OS user), so no
password appears in a process list; ``pg_basebackup -R`` writes the same connection (passfile
included) to the standby's ``postgresql.auto.conf``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from txn_offsets.devstack import postgres
from txn_offsets.devstack._proc import pick_free_port, pid_alive, read_pid, require_port_free
from txn_offsets.errors import StackError

__all__ = [
    "Pair",
    "kill_9",
    "make_synchronous",
    "multi_host_url",
    "promote",
    "running_pid",
    "start",
    "stop",
    "wait_replayed",
]

logger = logging.getLogger(__name__)

SERVICE = "replica"
APPLICATION_NAME = "txn_offsets_replica"  # the replica's walreceiver, as the primary sees it


def _passfile(replica: postgres.PgCluster, primary: postgres.PgCluster, admin_password: str) -> Path:
    base = replica.data_dir.parent
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    postgres._chown(replica, base)
    path = base / ".pgpass"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    escaped = admin_password.replace("\\", "\\\\").replace(":", "\\:")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{primary.host}:{primary.port}:*:{postgres.ADMIN_USER}:{escaped}\n")
    postgres._chown(replica, path)
    return path


def _basebackup(primary: postgres.PgCluster, replica: postgres.PgCluster, admin_password: str) -> None:
    passfile = _passfile(replica, primary, admin_password)
    conninfo = (
        f"host={primary.host} port={primary.port} user={postgres.ADMIN_USER} passfile={passfile} "
        f"application_name={APPLICATION_NAME} connect_timeout=10"
    )
    done = replica.run(
        "pg_basebackup", "-d", conninfo, "-D", str(replica.data_dir), "-R", "-X", "stream", "-c", "fast",
        timeout_s=600,
    )  # fmt: skip
    if done.returncode != 0:
        shutil.rmtree(replica.data_dir, ignore_errors=True)
        raise StackError(
            SERVICE,
            f"pg_basebackup from {primary.host}:{primary.port} failed: {done.stderr.strip()[-500:]}",
            f"check that the primary runs and allows replication connections from {replica.host} "
            "(pg_hba.conf)",
        )


def running_pid(replica: postgres.PgCluster) -> int | None:
    return read_pid(replica.pid_file, SERVICE, str(replica.data_dir))


def start(primary: postgres.PgCluster, replica: postgres.PgCluster, admin_password: str) -> int:
    """Base-backup `primary` into `replica` (first time), start it as a hot standby and wait until
    it streams; returns its postmaster pid. Idempotent: a running replica is only checked."""
    pid = running_pid(replica)
    if pid is None:
        if not (replica.data_dir / "PG_VERSION").exists():
            _basebackup(primary, replica, admin_password)
        setting = "TXN_OFFSETS_REPLICA_PORT (or remove .stack/state.json)"
        require_port_free(SERVICE, replica.port, setting, replica.host)
        postgres._write_conf(replica)
        replica.log_file.touch()
        postgres._chown(replica, replica.log_file)
        done = replica.run(
            "pg_ctl", "-D", str(replica.data_dir), "-l", str(replica.log_file), "-w", "-t", "90", "start"
        )
        pid = postgres._postmaster_pid(replica)
        if done.returncode != 0 or pid is None:
            tail = replica.log_file.read_text(errors="replace")[-800:]
            raise StackError(SERVICE, f"pg_ctl start failed: {done.stderr.strip()[-300:]} {tail}",
                             f"read {replica.log_file}")  # fmt: skip
        replica.pid_file.write_text(f"{pid}\n")
        logger.info("replica started (pid %d, port %d)", pid, replica.port)
    postgres._wait_ready(replica, admin_password)
    _wait_streaming(primary, admin_password)
    return pid


def _wait_streaming(primary: postgres.PgCluster, admin_password: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(**postgres.admin_conninfo(primary, admin_password), autocommit=True) as conn:  # type: ignore[arg-type]
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.2)
    raise StackError(SERVICE, f"not streaming from {primary.host}:{primary.port} after {timeout_s:.0f}s",
                     "read the replica's postgres.log")  # fmt: skip


def make_synchronous(primary: postgres.PgCluster, admin_password: str, timeout_s: float = 60) -> None:
    """Turn the primary's replication synchronous (``synchronous_standby_names`` = our replica's
    application_name, ``ALTER SYSTEM`` + reload) and wait until the replica is the sync standby:
    from then on a COMMIT is acknowledged only once the replica has its WAL, so a failover to it
    loses nothing a client was told is committed (a COMMIT in flight stays ambiguous: the guard's
    re-read settles it)."""
    with psycopg.connect(**postgres.admin_conninfo(primary, admin_password), autocommit=True) as conn:  # type: ignore[arg-type]
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{APPLICATION_NAME}'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout_s
        while not conn.execute(
            "SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND sync_state = 'sync'",
            (APPLICATION_NAME,),
        ).fetchall():
            if time.monotonic() > deadline:
                raise StackError(SERVICE, f"not a synchronous standby after {timeout_s:.0f}s",
                                 "read the primary's postgres.log")  # fmt: skip
            time.sleep(0.05)


def in_recovery(cluster: postgres.PgCluster, admin_password: str) -> bool:
    """True while `cluster` is a standby (False once promoted or for a primary)."""
    with psycopg.connect(**postgres.admin_conninfo(cluster, admin_password), autocommit=True) as conn:  # type: ignore[arg-type]
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def wait_replayed(
    primary: postgres.PgCluster, replica: postgres.PgCluster, admin_password: str, timeout_s: float = 60
) -> None:
    """Until the replica has replayed everything the primary has written so far (a planned
    switchover loses nothing)."""
    with psycopg.connect(**postgres.admin_conninfo(primary, admin_password), autocommit=True) as conn:  # type: ignore[arg-type]
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    target = str(row[0]) if row else "0/0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(**postgres.admin_conninfo(replica, admin_password), autocommit=True) as conn:  # type: ignore[arg-type]
            got = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
        if got and got[0]:
            return
        time.sleep(0.1)
    raise StackError(SERVICE, f"has not replayed {target} after {timeout_s:.0f}s", "read its postgres.log")


def promote(replica: postgres.PgCluster, admin_password: str, timeout_s: float = 60) -> None:
    """``pg_ctl promote``: the standby becomes a primary (takes writes) and leaves recovery."""
    done = replica.run("pg_ctl", "-D", str(replica.data_dir), "-w", "-t", str(int(timeout_s)), "promote")
    if done.returncode != 0:
        raise StackError(SERVICE, f"pg_ctl promote failed: {done.stderr.strip()[-300:]}",
                         f"read {replica.log_file}")  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while in_recovery(replica, admin_password):
        if time.monotonic() > deadline:
            raise StackError(SERVICE, "still in recovery after promote", f"read {replica.log_file}")
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def freeze(cluster: postgres.PgCluster, frozen: list[int]) -> None:
    """SIGSTOP the server's postmaster, then every process it has (the machine hangs: no answer,
    no commit, the kernel still acknowledges TCP). Each pid goes into `frozen` before it is
    stopped, so a caller's ``finally`` can always kill what was stopped. The postmaster stops
    first, so nothing new forks while its children are listed; a child that exits between the
    listing and its signal (a backend whose client just closed) is gone, which is as frozen as
    stopped. Nothing happens if the server does not run."""
    postmaster = postgres._postmaster_pid(cluster)
    if postmaster is None or not pid_alive(postmaster):
        return
    frozen.append(postmaster)
    os.kill(postmaster, signal.SIGSTOP)
    for pid in _children(postmaster):
        frozen.append(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)


def kill_9(cluster: postgres.PgCluster) -> int | None:
    """SIGKILL the server's postmaster and every one of its processes (the machine dies: nothing
    is flushed, no client gets a goodbye); returns the postmaster's pid, None if none ran."""
    pid = postgres._postmaster_pid(cluster)
    if pid is None or not pid_alive(pid):
        return None
    children = _children(pid)
    for victim in (pid, *children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in (pid, *children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    cluster.pid_file.unlink(missing_ok=True)
    return pid


def stop(cluster: postgres.PgCluster, mode: str = "fast") -> bool:
    """``pg_ctl stop -m <mode>`` if it runs (any role); True if something was stopped."""
    pid = postgres._postmaster_pid(cluster)
    if pid is None or not pid_alive(pid):
        cluster.pid_file.unlink(missing_ok=True)
        return False
    done = cluster.run("pg_ctl", "-D", str(cluster.data_dir), "-m", mode, "-w", "-t", "60", "stop")
    if done.returncode != 0 and pid_alive(pid):
        kill_9(cluster)
    cluster.pid_file.unlink(missing_ok=True)
    return True


def multi_host_url(
    user: str, password: str, dbname: str, ports: list[int], hosts: list[str] | None = None
) -> str:
    """A libpq multi-host URL over `hosts` (one per port; default 127.0.0.1 for each) and `ports`
    that connects to the one taking writes (``target_session_attrs=read-write``); one port: that
    server's plain URL (a standby too)."""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}"
    names = hosts if hosts is not None else ["127.0.0.1"] * len(ports)
    if len(ports) == 1:
        return f"postgresql+psycopg://{auth}@{names[0]}:{ports[0]}/{dbname}"
    hosts_query = "&".join(f"host={name}:{port}" for name, port in zip(names, ports, strict=True))
    return f"postgresql+psycopg://{auth}@/{dbname}?{hosts_query}&target_session_attrs=read-write"


@dataclass(frozen=True)
class Pair:
    """A throwaway primary and its streaming replica under `base` on free loopback ports (chaos)."""

    base: Path
    primary: postgres.PgCluster
    replica: postgres.PgCluster
    admin_password: str
    app_password: str

    @classmethod
    def create(cls, base: Path, admin_password: str, app_password: str) -> Pair:
        p1, p2 = pick_free_port(), pick_free_port()
        while p2 == p1:
            p2 = pick_free_port()
        primary = postgres.cluster_for(base / "primary", p1)
        replica = postgres.cluster_for(base / "replica", p2)
        return cls(base, primary, replica, admin_password, app_password)

    def start(self) -> None:
        for cluster in (self.primary, self.replica):
            cluster.pid_file.parent.mkdir(parents=True, exist_ok=True)
        postgres.start(self.primary, self.admin_password, self.app_password)
        start(self.primary, self.replica, self.admin_password)

    def url(self, *, admin: bool = False, node: postgres.PgCluster | None = None) -> str:
        """The multi-host URL (both servers), or one server's when `node` is given."""
        user = postgres.ADMIN_USER if admin else postgres.APP_USER
        password = self.admin_password if admin else self.app_password
        ports = [node.port] if node is not None else [self.primary.port, self.replica.port]
        return multi_host_url(user, password, postgres.APP_DB, ports)

    def destroy(self) -> None:
        """Stop both servers (immediately: throwaway) and remove their data."""
        for cluster in (self.replica, self.primary):
            stop(cluster, "immediate")
            # the data lies under /var/lib/txn-offsets/<digest>/ when the OS user cannot enter `base`
            outside = not cluster.data_dir.is_relative_to(self.base)
            shutil.rmtree(cluster.data_dir.parent.parent if outside else cluster.data_dir.parent, True)
            shutil.rmtree(cluster.pid_file.parent, ignore_errors=True)
