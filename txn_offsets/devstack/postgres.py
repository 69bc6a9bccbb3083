"""A PostgreSQL cluster for development and tests, run from the system's server binaries: in the
stack directory, on one address only (127.0.0.1; a lab host's own address), no unix socket,
scram-sha-256 for every connection; as root, the server runs as the `postgres` OS user (or a system
user we create: it refuses to run as root).
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
from psycopg import sql

from txn_offsets.devstack._proc import read_pid, require_port_free, stop_pid
from txn_offsets.errors import StackError
from txn_offsets.store.roles import ROLE_ATTRIBUTES

logger = logging.getLogger(__name__)

SERVICE = "postgres"
ADMIN_USER = "txn_offsets_admin"
# the database's owner: it migrates the store and grants (TXN_OFFSETS_OWNER_DATABASE_URL)
APP_USER = "txn_offsets"
# a login run role that jobs run as (TXN_OFFSETS_DATABASE_URL); granted nothing here: the owner's
# `txn-offsets db grants --role job_runner --apply` does, once the store is migrated
RUN_USER = "job_runner"
APP_DB = "txn_offsets"
_CONF_BEGIN = "# --- txn-offsets devstack (managed, rewritten on every start) ---"


@dataclass(frozen=True)
class PgCluster:
    """Where the cluster lives and how to reach it."""

    data_dir: Path
    log_file: Path
    pid_file: Path
    port: int
    bin_dir: Path
    os_user: str | None  # None: run as ourselves
    host: str = "127.0.0.1"  # the one address it listens on
    # a network (CIDR) whose clients may also log in and replicate (scram-sha-256), besides the
    # loopback that initdb's pg_hba.conf allows: the lab's subnet
    clients: str | None = None

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a server binary as the cluster's OS user."""
        kwargs: dict[str, object] = {}
        if self.os_user is not None:
            kwargs = {"user": self.os_user, "group": pwd.getpwnam(self.os_user).pw_gid}
        done: subprocess.CompletedProcess[str] = subprocess.run(  # noqa: PLW1510 - callers check returncode
            [str(self.bin_dir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd="/",
            **kwargs,  # type: ignore[call-overload]
        )
        return done


def find_bin_dir() -> Path | None:
    """The newest PostgreSQL server bin directory on this machine, or None."""
    override = os.environ.get("TXN_OFFSETS_PG_BIN")
    if override:
        return Path(override)
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        reverse=True,
    )
    if candidates:
        return candidates[0].parent
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    return None


def install_server() -> Path:
    """Install Debian's postgresql server package (root only), without its default cluster."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(
            SERVICE,
            "the PostgreSQL server binaries (initdb, pg_ctl) are not installed",
            "install them (Debian/Ubuntu: `sudo apt-get install postgresql`) or set TXN_OFFSETS_PG_BIN "
            "to their bin directory",
        )
    logger.info("installing Debian's postgresql package (server binaries missing)")
    # The package would create and start a 'main' cluster on 5432; we only want the binaries.
    conf = Path("/etc/postgresql-common/createcluster.conf")
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists():
        conf.write_text("create_main_cluster = false\n")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise StackError(
                SERVICE,
                f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-400:]}",
                "check that Debian's package mirror is reachable, or install postgresql by hand",
            )
    found = find_bin_dir()
    if found is None:
        raise StackError(
            SERVICE, "postgresql was installed but pg_ctl was not found", "set TXN_OFFSETS_PG_BIN"
        )
    return found


def _service_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "txn-offsets-pg"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "txn-offsets-pg"],
        check=True,
        capture_output=True,
    )
    return "txn-offsets-pg"


def service_user() -> str | None:
    """The OS user the stack's servers run as: None (ourselves) unless we are root."""
    return _service_user()


def reachable_by(user: str, path: Path) -> bool:
    """True if `user` can traverse every directory down to `path`."""
    entry = pwd.getpwnam(user)
    probe = path
    while not probe.exists():
        probe = probe.parent
    for directory in [probe, *probe.parents]:
        st = directory.stat()
        if st.st_uid == entry.pw_uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid == entry.pw_gid:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return False
    return True


def cluster_for(stack_dir: Path, port: int, host: str = "127.0.0.1", clients: str | None = None) -> PgCluster:
    """Where this stack's cluster lives (project-local unless the server's OS user cannot reach it),
    listening on `host`, with clients from `clients` (CIDR) allowed too."""
    bin_dir = find_bin_dir() or install_server()
    user = _service_user()
    base = stack_dir / "postgres"
    if user is not None and not reachable_by(user, base):
        # e.g. a clone inside a 0700 temp directory: the postgres user cannot enter it, and we do
        # not loosen permissions on directories that are not ours. Keep the data beside it instead.
        digest = hashlib.sha256(str(stack_dir).encode()).hexdigest()[:12]
        base = Path("/var/lib/txn-offsets") / digest / "postgres"
        logger.debug("%s is not reachable by OS user %r; cluster data goes to %s", stack_dir, user, base)
    return PgCluster(
        data_dir=base / "data",
        log_file=base / "postgres.log",
        pid_file=stack_dir / "postgres.pid",
        port=port,
        bin_dir=bin_dir,
        os_user=user,
        host=host,
        clients=clients,
    )


def _chown(cluster: PgCluster, path: Path) -> None:
    if cluster.os_user is not None:
        entry = pwd.getpwnam(cluster.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _initdb(cluster: PgCluster, admin_password: str) -> None:
    base = cluster.data_dir.parent
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    _chown(cluster, base)
    pwfile = base / ".initdb-pw"
    # initdb reads the superuser password from a file so it never appears in a process list.
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(admin_password + "\n")
    _chown(cluster, pwfile)
    try:
        done = cluster.run(
            "initdb",
            "-D",
            str(cluster.data_dir),
            "-U",
            ADMIN_USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        raise StackError(
            SERVICE,
            f"initdb failed: {done.stderr.strip()[-500:]}",
            f"remove {cluster.data_dir} and run `make stack-up` again",
        )


def _write_conf(cluster: PgCluster) -> None:
    conf = cluster.data_dir / "postgresql.conf"
    text = conf.read_text()
    if _CONF_BEGIN in text:
        text = text[: text.index(_CONF_BEGIN)]
    text += "\n".join(
        [
            _CONF_BEGIN,
            f"listen_addresses = '{cluster.host}'",
            f"port = {cluster.port}",
            "unix_socket_directories = ''",
            "max_connections = 300",
            "shared_buffers = 256MB",
            "password_encryption = 'scram-sha-256'",
            "log_min_messages = warning",
            *_statement_stats(cluster),
            "",
        ]
    )
    conf.write_text(text)
    hba = cluster.data_dir / "pg_hba.conf"
    text = hba.read_text()
    if _CONF_BEGIN in text:
        text = text[: text.index(_CONF_BEGIN)]
    if cluster.clients is not None:
        text += f"{_CONF_BEGIN}\nhost all all {cluster.clients} scram-sha-256\n"
        text += f"host replication all {cluster.clients} scram-sha-256\n"
    hba.write_text(text)


#: PostgreSQL's statistics of each statement's calls and time (its contrib module, in Debian's server
#: package): loaded at start when the server has it, and created in the project's database, so that
#: where PostgreSQL's time goes is one query away (benchmarks/pg_statements.py: per batch by kind)
STATEMENT_STATS = "pg_stat_statements"


def _statement_stats(cluster: PgCluster) -> list[str]:
    """The settings that load :data:`STATEMENT_STATS`, when this server's library directory has it."""
    if not (cluster.bin_dir.parent / "lib" / f"{STATEMENT_STATS}.so").exists():
        return []
    return [f"shared_preload_libraries = '{STATEMENT_STATS}'"]


def _postmaster_pid(cluster: PgCluster) -> int | None:
    pid_path = cluster.data_dir / "postmaster.pid"
    try:
        return int(pid_path.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def start(
    cluster: PgCluster, admin_password: str, app_password: str, run_password: str | None = None
) -> None:
    """Initialise (first time), start and wait for the cluster; create the project's roles (the
    database's owner, and the run role when given its password) and database."""
    marker = str(cluster.data_dir)
    running = read_pid(cluster.pid_file, SERVICE, marker)
    if running is None:
        if not (cluster.data_dir / "PG_VERSION").exists():
            _initdb(cluster, admin_password)
        setting = "TXN_OFFSETS_PG_PORT (or remove .stack/ports.json)"
        require_port_free(SERVICE, cluster.port, setting, cluster.host)
        _write_conf(cluster)
        cluster.log_file.touch()
        _chown(cluster, cluster.log_file)
        done = cluster.run(
            "pg_ctl", "-D", str(cluster.data_dir), "-l", str(cluster.log_file), "-w", "-t", "90", "start"
        )
        if done.returncode != 0:
            tail = cluster.log_file.read_text()[-800:] if cluster.log_file.exists() else ""
            raise StackError(
                SERVICE,
                f"pg_ctl start failed: {done.stdout.strip()[-300:]} {done.stderr.strip()[-300:]} {tail}",
                f"read {cluster.log_file}; a stale {cluster.data_dir}/postmaster.pid can be removed if no "
                f"postgres runs",
            )
        pid = _postmaster_pid(cluster)
        if pid is None:
            raise StackError(
                SERVICE, "the server started but wrote no postmaster.pid", f"read {cluster.log_file}"
            )
        cluster.pid_file.write_text(f"{pid}\n")
        logger.info("postgres started (pid %d, port %d)", pid, cluster.port)
    _wait_ready(cluster, admin_password)
    passwords = {APP_USER: app_password} | ({RUN_USER: run_password} if run_password is not None else {})
    _ensure_roles(cluster, admin_password, passwords)
    _create_statement_stats(cluster, admin_password)


def admin_conninfo(cluster: PgCluster, password: str, dbname: str = "postgres") -> dict[str, object]:
    return {
        "host": cluster.host,
        "port": cluster.port,
        "user": ADMIN_USER,
        "password": password,
        "dbname": dbname,
        "connect_timeout": 5,
    }


def _wait_ready(cluster: PgCluster, admin_password: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(**admin_conninfo(cluster, admin_password)) as conn:  # type: ignore[arg-type]
                conn.execute("SELECT 1").fetchone()
                return
        except psycopg.OperationalError as exc:
            last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            time.sleep(0.5)
    raise StackError(SERVICE, f"not ready after {timeout_s:.0f}s: {last}", f"read {cluster.log_file}")


#: each role's attributes: the owner may create the database; the run role is a job's role
#: (txn_offsets.store.roles.ROLE_ATTRIBUTES: no superuser, no DDL beyond its grants, no RLS bypass)
_ROLE_ATTRIBUTES = {APP_USER: "LOGIN CREATEDB", RUN_USER: ROLE_ATTRIBUTES}


def _ensure_roles(cluster: PgCluster, admin_password: str, passwords: dict[str, str]) -> None:
    """The roles and the database. A role whose password works is left alone: the same password set
    again is a new SCRAM verifier (new salt), and a PgBouncer holding the old one in its userlist
    could no longer log in (a plain ``dev up`` after ``--pooler pgbouncer`` broke pooling)."""
    info = admin_conninfo(cluster, admin_password)
    with psycopg.connect(**info, autocommit=True) as conn:  # type: ignore[arg-type]
        for role, password in passwords.items():
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            try:
                psycopg.connect(**{**admin_conninfo(cluster, password), "user": role}).close()  # type: ignore[arg-type]
                works = True
            except psycopg.OperationalError:
                works = False
            if not exists or not works:
                verb = "ALTER" if exists else "CREATE"
                # Role passwords cannot be bound parameters: the statement carries the SCRAM
                # verifier libpq computes here, never the password (a statement's text is kept by
                # pg_stat_statements, which the server loads), as `db role --apply` does.
                verifier = conn.pgconn.encrypt_password(password.encode(), role.encode()).decode()
                conn.execute(
                    sql.SQL("{} ROLE {} {} PASSWORD {}").format(
                        sql.SQL(verb),
                        sql.Identifier(role),
                        sql.SQL(_ROLE_ATTRIBUTES[role]),
                        sql.Literal(verifier),
                    )
                )
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (APP_DB,)).fetchone():
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(APP_USER)
                )
            )


def _create_statement_stats(cluster: PgCluster, admin_password: str) -> None:
    """:data:`STATEMENT_STATS` created in the project's database when the running server loaded it
    (a server started before its settings named it has not: the next start does)."""
    with psycopg.connect(**admin_conninfo(cluster, admin_password, APP_DB), autocommit=True) as conn:  # type: ignore[arg-type]
        loaded = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if loaded is not None and STATEMENT_STATS in (name.strip() for name in str(loaded[0]).split(",")):
            conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier(STATEMENT_STATS)))


def stop(cluster: PgCluster) -> bool:
    """Stop the cluster if it runs; True if something was stopped."""
    pid = read_pid(cluster.pid_file, SERVICE, str(cluster.data_dir))
    if pid is None:
        return False
    done = cluster.run("pg_ctl", "-D", str(cluster.data_dir), "-m", "fast", "-w", "-t", "60", "stop")
    if done.returncode != 0:
        logger.warning("pg_ctl stop failed (%s); signalling pid %d", done.stderr.strip()[-200:], pid)
    stop_pid(pid)
    cluster.pid_file.unlink(missing_ok=True)
    logger.info("postgres stopped (pid %d)", pid)
    return True


def restart_immediate(cluster: PgCluster, admin_password: str) -> None:
    """Crash-stop (`-m immediate`) and start again: for fault-injection tests."""
    cluster.run("pg_ctl", "-D", str(cluster.data_dir), "-m", "immediate", "-w", "stop")
    done = cluster.run(
        "pg_ctl", "-D", str(cluster.data_dir), "-l", str(cluster.log_file), "-w", "-t", "90", "start"
    )
    if done.returncode != 0:
        raise StackError(SERVICE, f"restart failed: {done.stderr.strip()[-300:]}", f"read {cluster.log_file}")
    pid = _postmaster_pid(cluster)
    cluster.pid_file.write_text(f"{pid}\n")
    _wait_ready(cluster, admin_password)
