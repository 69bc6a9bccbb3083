"""PgBouncer in front of the stack's PostgreSQL (``txn-offsets dev up --pooler pgbouncer``).

Debian's ``pgbouncer`` (installed from the package when missing and running as root), on a loopback
port (the lab's: on its host's address), transaction pooling with a small pool
(``default_pool_size = 2``): the production shape that txn_offsets must stay exact behind. Clients
authenticate with SCRAM; the auth file holds the roles' SCRAM secrets copied from ``pg_authid`` (the
same salt and iterations, so PgBouncer logs in to PostgreSQL with the client's proof: no password
is stored in clear). ``options`` (libpq's
startup parameter, which txn_offsets uses for its timeouts on direct connections) is ignored, as
PgBouncer 1.18 requires: the library then sets its timeouts in each transaction.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from txn_offsets.devstack import postgres
from txn_offsets.devstack._proc import adopt, pid_alive, port_free, read_pid, require_port_free, stop_pid
from txn_offsets.errors import StackError

__all__ = ["POOL_MODES", "Bouncer", "find_binary", "home_for", "running_pid", "start", "stop"]

logger = logging.getLogger(__name__)

SERVICE = "pgbouncer"
POOL_MODES = ("transaction", "session", "statement")


@dataclass(frozen=True)
class Bouncer:
    """One PgBouncer process: its files (in `home`, readable by `os_user`) and where it listens."""

    home: Path
    pid_file: Path
    port: int
    upstream_host: str
    upstream_port: int
    os_user: str | None  # None: run as ourselves (PgBouncer refuses to run as root)
    pool_mode: str = "transaction"
    pool_size: int = 2
    admin_user: str | None = None  # may use the admin console (SHOW POOLS)
    listen_host: str = "127.0.0.1"  # the one address it listens on

    @property
    def config(self) -> Path:
        return self.home / "pgbouncer.ini"

    @property
    def auth_file(self) -> Path:
        return self.home / "userlist.txt"

    @property
    def log_file(self) -> Path:
        return self.home / "pgbouncer.log"

    def url(self, user: str, password: str, dbname: str) -> str:
        return f"postgresql+psycopg://{user}:{password}@{self.listen_host}:{self.port}/{dbname}"


def home_for(wanted: Path, os_user: str | None) -> Path:
    """`wanted`, or a directory under /var/lib/txn-offsets when `os_user` cannot reach it (a clone
    inside a 0700 directory), as the stack does for PostgreSQL's data."""
    if os_user is None or postgres.reachable_by(os_user, wanted):
        return wanted
    digest = hashlib.sha256(str(wanted).encode()).hexdigest()[:12]
    return Path("/var/lib/txn-offsets") / digest / "pgbouncer"


def find_binary() -> Path | None:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )
    return Path(found) if found else None


def install() -> Path:
    """Install Debian's pgbouncer package (root only); a StackError that says how otherwise."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(
            SERVICE,
            "the pgbouncer binary is not installed",
            "install it (Debian/Ubuntu: `sudo apt-get install pgbouncer`) or start the stack without "
            "--pooler",
        )
    logger.info("installing Debian's pgbouncer package (binary missing)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "pgbouncer"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise StackError(
                SERVICE,
                f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-400:]}",
                "check that Debian's package mirror is reachable, or install pgbouncer by hand",
            )
    found = find_binary()
    if found is None:
        raise StackError(SERVICE, "pgbouncer was installed but its binary was not found", "install it")
    return found


def _own(bouncer: Bouncer, path: Path, mode: int) -> None:
    path.chmod(mode)
    if bouncer.os_user is not None:
        entry = pwd.getpwnam(bouncer.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _write_private(bouncer: Bouncer, path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    _own(bouncer, path, 0o600)


def _auth_lines(admin_conninfo: dict[str, object], roles: list[str]) -> str:
    """userlist.txt lines: each role's SCRAM secret as PostgreSQL stores it (read as superuser)."""
    with psycopg.connect(**admin_conninfo, autocommit=True) as conn:  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY(%s) ORDER BY rolname", (roles,)
        ).fetchall()
    missing = sorted(set(roles) - {name for name, _ in rows})
    if missing:
        raise StackError(SERVICE, f"role(s) {', '.join(missing)} not found", "run `make stack-up` again")
    for name, secret in rows:
        if not str(secret or "").startswith("SCRAM-SHA-256$"):
            raise StackError(
                SERVICE, f"role {name} has no SCRAM-SHA-256 password", "set its password (scram-sha-256)"
            )
    return "".join(f'"{name}" "{secret}"\n' for name, secret in rows)


def _render(bouncer: Bouncer) -> str:
    return "\n".join(
        [
            "; written by txn_offsets.devstack (rewritten on every start)",
            "[databases]",
            f"* = host={bouncer.upstream_host} port={bouncer.upstream_port}",
            "",
            "[pgbouncer]",
            f"listen_addr = {bouncer.listen_host}",
            f"listen_port = {bouncer.port}",
            "unix_socket_dir =",
            "auth_type = scram-sha-256",
            f"auth_file = {bouncer.auth_file}",
            f"pool_mode = {bouncer.pool_mode}",
            f"default_pool_size = {bouncer.pool_size}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            "max_client_conn = 400",
            # libpq's options (txn_offsets' timeouts on direct connections) cannot pass 1.18
            "ignore_startup_parameters = options",
            "server_check_delay = 10",
            *([f"admin_users = {bouncer.admin_user}"] if bouncer.admin_user else []),
            "log_connections = 0",
            "log_disconnections = 0",
            "",
        ]
    )


def start(bouncer: Bouncer, admin_conninfo: dict[str, object], roles: list[str]) -> int:
    """Write the config and auth file, start PgBouncer (unless ours already runs) and wait until a
    query goes through it; returns its pid. `admin_conninfo` reaches the upstream as a superuser."""
    if bouncer.pool_mode not in POOL_MODES:
        raise StackError(SERVICE, f"unknown pool mode {bouncer.pool_mode!r}", f"use one of {POOL_MODES}")
    binary = find_binary() or install()
    marker = str(bouncer.config)
    pid = read_pid(bouncer.pid_file, SERVICE, marker)
    if pid is None:
        require_port_free(SERVICE, bouncer.port, "TXN_OFFSETS_PGBOUNCER_PORT", bouncer.listen_host)
        bouncer.home.mkdir(parents=True, exist_ok=True)
        _own(bouncer, bouncer.home, 0o700)
        _write_private(bouncer, bouncer.auth_file, _auth_lines(admin_conninfo, roles))
        _write_private(bouncer, bouncer.config, _render(bouncer))
        bouncer.log_file.touch()
        _own(bouncer, bouncer.log_file, 0o600)
        user = ["-u", bouncer.os_user] if bouncer.os_user is not None else []
        with bouncer.log_file.open("ab") as log:
            proc = subprocess.Popen(
                [str(binary), *user, str(bouncer.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the shell that ran `make stack-up`
                cwd="/",
            )
        adopt(proc)
        bouncer.pid_file.write_text(f"{proc.pid}\n")
        logger.info("pgbouncer starting (pid %d, port %d)", proc.pid, bouncer.port)
        pid = proc.pid
    _wait_ready(bouncer, pid, admin_conninfo)
    return pid


def _wait_ready(bouncer: Bouncer, pid: int, admin_conninfo: dict[str, object], timeout_s: float = 30) -> None:
    """Until a query through PgBouncer (as the upstream's superuser, over SCRAM) is answered."""
    info = {**admin_conninfo, "host": bouncer.listen_host, "port": bouncer.port}
    deadline = time.monotonic() + timeout_s
    last = "not listening yet"
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            tail = bouncer.log_file.read_text(errors="replace")[-1200:] if bouncer.log_file.exists() else ""
            bouncer.pid_file.unlink(missing_ok=True)
            raise StackError(SERVICE, f"pgbouncer exited while starting:\n{tail}", f"read {bouncer.log_file}")
        if not port_free(bouncer.port, bouncer.listen_host):
            try:
                with psycopg.connect(**info, autocommit=True) as conn:  # type: ignore[arg-type]
                    conn.execute("SELECT 1").fetchone()
                    return
            except psycopg.Error as exc:
                last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        time.sleep(0.2)
    raise StackError(SERVICE, f"not ready after {timeout_s:.0f}s: {last}", f"read {bouncer.log_file}")


def running_pid(bouncer: Bouncer) -> int | None:
    return read_pid(bouncer.pid_file, SERVICE, str(bouncer.config))


def stop(bouncer: Bouncer) -> bool:
    """Stop the PgBouncer we started (by pid); True if something was stopped."""
    pid = running_pid(bouncer)
    if pid is None:
        return False
    stop_pid(pid, timeout_s=15)
    bouncer.pid_file.unlink(missing_ok=True)
    logger.info("pgbouncer stopped (pid %d)", pid)
    return True
