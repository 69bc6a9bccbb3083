"""The embedded local stack: PostgreSQL + Kafka on loopback, without Docker; optionally PgBouncer
in front of PostgreSQL (``up(pooler="pgbouncer")``: transaction pooling, a pool of 2), and a
streaming replica beside it (``up(replica=True)``: :mod:`.replica`).

``up`` is idempotent (a running service is only checked), ``down`` stops exactly the processes whose
pids ``up`` recorded, ``status`` only reports (a stale pid file is named, never removed).
PostgreSQL gets two login roles besides its superuser: the database's owner ``txn_offsets``
(TXN_OFFSETS_OWNER_DATABASE_URL: migrations, grants, result tables) and the run role ``job_runner``
(TXN_OFFSETS_DATABASE_URL, what jobs run as: no DDL, no row-level security bypass, and no grants until
the owner runs ``txn-offsets db grants --role job_runner --apply``).
Connection settings go to ``<stack>/env`` (mode 0600) as ``KEY='value'`` lines
(single-quoted: ``set -a; . .stack/env; set +a`` gives the values as written; :func:`read_env_file`); the
pooled URL (TXN_OFFSETS_POOLED_DATABASE_URL) is there while the stack's PgBouncer runs, the
replica's (TXN_OFFSETS_REPLICA_DATABASE_URL) and the multi-host one over both servers
(TXN_OFFSETS_HA_DATABASE_URL, ``target_session_attrs=read-write``) while the replica runs.
TLS and SASL: ``up(tls_on=True)`` (PostgreSQL ssl on, a SASL_SSL Kafka listener: :mod:`.tls`),
whose endpoints (TXN_OFFSETS_TLS_*) the env file names from then on (TLS stays on).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from txn_offsets.devstack import kafka, pgbouncer, postgres, tls
from txn_offsets.devstack import replica as standby
from txn_offsets.devstack._proc import pick_free_port, read_pid
from txn_offsets.errors import StackError

__all__ = ["POOLERS", "Stack", "StackStatus", "read_env_file", "shell_quote", "write_env_file"]

POOLERS = ("pgbouncer",)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StackStatus:
    postgres_pid: int | None
    kafka_pid: int | None
    postgres_port: int
    kafka_port: int
    env_file: Path
    pgbouncer_pid: int | None = None
    pgbouncer_port: int | None = None  # None: the stack was never started with a pooler
    kafka_sasl_port: int | None = None  # None: the stack was never started with TLS
    replica_pid: int | None = None
    replica_port: int | None = None  # None: the stack was never started with a replica
    # service -> its pid file, which names a process that is gone (status leaves it as found)
    stale: Mapping[str, Path] = field(default_factory=dict)


def shell_quote(value: str) -> str:
    """`value` in single quotes for a POSIX shell, each ``'`` in it written ``'\\''``: nothing in
    it (``&``, ``;``, ``$``, spaces, backquotes) is interpreted when the file is sourced."""
    return "'" + value.replace("'", "'\\''") + "'"


def write_env_file(path: Path, lines: list[str]) -> None:
    """Write ``KEY=value`` `lines` to `path` (mode 0600) as ``KEY='value'``: the file can be
    sourced (``set -a; . .stack/env; set +a``) and gives each value exactly as it is here."""
    out = []
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise StackError("stack", f"cannot write {key!r} to {path}", "name it as a shell variable")
        if "\n" in value or "\r" in value:  # one line per variable: read_env_file and grep rely on it
            raise StackError(
                "stack", f"the value of {key} holds a line break", f"move the stack ({path.parent})"
            )
        out.append(f"{key}={shell_quote(value)}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(out))


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of an env file as a shell sourcing it sees them: ``KEY='value'`` lines
    (:func:`write_env_file`) unquoted; a value not starting with a quote (a file written before
    values were quoted) is taken as it stands. No file: nothing."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if value.startswith("'"):
            try:
                words = shlex.split(value)
            except ValueError:  # an unclosed quote
                words = []
            if len(words) != 1:
                raise StackError(
                    "stack",
                    f"{path}: the value of {key} is not one quoted word",
                    "run `txn-offsets dev up` to write it again",
                )
            value = words[0]
        out[key] = value
    return out


class Stack:
    """One project's local stack, kept in ``stack_dir`` (default ``./.stack``)."""

    def __init__(self, stack_dir: Path) -> None:
        self.dir = stack_dir.resolve()

    def __repr__(self) -> str:
        return f"Stack({str(self.dir)!r})"

    @property
    def env_file(self) -> Path:
        return self.dir / "env"

    def _state(
        self, pooler: str | None = None, replica: bool = False, tls_on: bool = False
    ) -> dict[str, object]:
        """Ports and passwords chosen on the first start, reused afterwards (0600, never logged);
        PgBouncer's port only once the stack is started with a pooler."""
        path = self.dir / "state.json"
        state: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
        changed = False
        wanted_ports = [
            ("pg_port", "TXN_OFFSETS_PG_PORT"),
            ("kafka_port", "TXN_OFFSETS_KAFKA_PORT"),
            ("kafka_controller_port", "TXN_OFFSETS_KAFKA_CONTROLLER_PORT"),
        ]
        if pooler is not None or "pgbouncer_port" in state:
            wanted_ports.append(("pgbouncer_port", "TXN_OFFSETS_PGBOUNCER_PORT"))
        if replica or "replica_port" in state:
            wanted_ports.append(("replica_port", "TXN_OFFSETS_REPLICA_PORT"))
        if tls_on or "kafka_sasl_port" in state:
            wanted_ports.append(("kafka_sasl_port", "TXN_OFFSETS_KAFKA_SASL_PORT"))
        for key, env in wanted_ports:
            if os.environ.get(env):
                wanted = int(os.environ[env])
                changed |= state.get(key) != wanted
                state[key] = wanted
            elif key not in state:  # never one already chosen: two listeners on one port fail Kafka
                taken = {v for k, v in state.items() if k.endswith("_port")}
                state[key] = next(p for p in iter(pick_free_port, None) if p not in taken)
                changed = True
        for key in ("pg_admin_password", "pg_app_password", "pg_run_password", "kafka_scram_password"):
            if key not in state:
                state[key] = secrets.token_urlsafe(24)
                changed = True
        if changed:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(state, fh)
        return state

    def _pg(self, state: dict[str, object]) -> postgres.PgCluster:
        return postgres.cluster_for(self.dir, int(str(state["pg_port"])))

    def _replica(self, state: dict[str, object]) -> postgres.PgCluster:
        return postgres.cluster_for(self.dir / "replica", int(str(state["replica_port"])))

    def _kafka(self, state: dict[str, object], libs: Path | None = None) -> kafka.KafkaNode:
        port, controller = int(str(state["kafka_port"])), int(str(state["kafka_controller_port"]))
        sasl = int(str(state["kafka_sasl_port"])) if "kafka_sasl_port" in state else None
        return kafka.KafkaNode(
            home=self.dir / "kafka",
            libs=libs or kafka.cache_dir() / f"kafka-{kafka.KAFKA_VERSION}" / "libs",
            port=port,
            controller_port=controller,
            extra_config=tls.broker_config(port, controller, sasl, self._tls()) if sasl else (),
        )

    def _tls(self) -> tls.TlsFiles:
        return tls.TlsFiles(self.dir / "tls")

    def _bouncer(self, state: dict[str, object], cluster: postgres.PgCluster) -> pgbouncer.Bouncer:
        return pgbouncer.Bouncer(
            home=pgbouncer.home_for(self.dir / "pgbouncer", cluster.os_user),
            pid_file=self.dir / "pgbouncer.pid",
            port=int(str(state["pgbouncer_port"])),
            upstream_host="127.0.0.1",
            upstream_port=cluster.port,
            os_user=cluster.os_user,
            admin_user=postgres.ADMIN_USER,
        )

    def up(self, pooler: str | None = None, replica: bool = False, tls_on: bool = False) -> StackStatus:
        """Start what is not running; with ``pooler="pgbouncer"`` also PgBouncer in front of
        PostgreSQL, with ``replica=True`` also a streaming replica (hot standby) beside it."""
        if pooler is not None and pooler not in POOLERS:
            raise StackError("stack", f"unknown pooler {pooler!r}", f"use one of {', '.join(POOLERS)}")
        self.dir.mkdir(parents=True, exist_ok=True)
        state = self._state(pooler, replica, tls_on=tls_on)
        files = tls.ensure_certs(self._tls().dir) if "kafka_sasl_port" in state else None
        kafka.java_binary()  # fail fast with a clear message before downloading anything
        libs = kafka.ensure_libs()
        cluster = self._pg(state)
        passwords = [str(state[key]) for key in ("pg_admin_password", "pg_app_password", "pg_run_password")]
        postgres.start(cluster, *passwords)
        if replica:
            (self.dir / "replica").mkdir(exist_ok=True)
            standby.start(cluster, self._replica(state), str(state["pg_admin_password"]))
        node = self._kafka(state, libs)
        if files and read_pid(node.pid_file, "kafka", str(node.config)) and not tls.listening(node.config):
            kafka.stop(node)  # running without the SASL_SSL listener: adding a listener needs a restart
        kafka.start(node)
        if files is not None:
            admin = postgres.admin_conninfo(cluster, str(state["pg_admin_password"]), postgres.APP_DB)
            tls.enable_postgres(files, cluster.data_dir, cluster.os_user, admin)
            password = str(state["kafka_scram_password"])
            tls.enable_kafka(files, node.bootstrap, int(str(state["kafka_sasl_port"])), password)
        if pooler == "pgbouncer":
            admin = postgres.admin_conninfo(cluster, str(state["pg_admin_password"]), postgres.APP_DB)
            pgbouncer.start(self._bouncer(state, cluster), admin, [postgres.APP_USER, postgres.ADMIN_USER])
        self._write_env(state, cluster, node)
        return self.status()

    def _write_env(
        self, state: dict[str, object], cluster: postgres.PgCluster, node: kafka.KafkaNode
    ) -> None:
        server = f"127.0.0.1:{cluster.port}/{postgres.APP_DB}"
        app = f"postgresql+psycopg://{postgres.APP_USER}:{state['pg_app_password']}@127.0.0.1:{cluster.port}"
        run = f"postgresql+psycopg://{postgres.RUN_USER}:{state['pg_run_password']}@{server}"
        admin = f"postgresql+psycopg://{postgres.ADMIN_USER}:{state['pg_admin_password']}@{server}"
        lines = [
            f"TXN_OFFSETS_DATABASE_URL={run}",  # what jobs run as: the run role
            f"TXN_OFFSETS_OWNER_DATABASE_URL={app}/{postgres.APP_DB}",  # db upgrade, grants, the tests
            f"TXN_OFFSETS_ADMIN_DATABASE_URL={admin}",
            f"TXN_OFFSETS_KAFKA_BOOTSTRAP={node.bootstrap}",
            f"TXN_OFFSETS_STACK_DIR={self.dir}",
        ]
        if "pgbouncer_port" in state and pgbouncer.running_pid(self._bouncer(state, cluster)) is not None:
            pooled = self._bouncer(state, cluster).url(postgres.APP_USER, str(state["pg_app_password"]), "")
            lines.append(f"TXN_OFFSETS_POOLED_DATABASE_URL={pooled}{postgres.APP_DB}")
        if "replica_port" in state and standby.running_pid(self._replica(state)) is not None:
            ports = [cluster.port, int(str(state["replica_port"]))]
            password = str(state["pg_app_password"])
            one = standby.multi_host_url(postgres.APP_USER, password, postgres.APP_DB, ports[1:])
            lines.append(f"TXN_OFFSETS_REPLICA_DATABASE_URL={one}")
            ha = standby.multi_host_url(postgres.APP_USER, password, postgres.APP_DB, ports)
            lines.append(f"TXN_OFFSETS_HA_DATABASE_URL={ha}")
        if "kafka_sasl_port" in state:
            sasl_port = int(str(state["kafka_sasl_port"]))
            lines += tls.env_lines(self._tls(), f"{app}/{postgres.APP_DB}", sasl_port)
        write_env_file(self.env_file, lines)

    def down(self) -> list[str]:
        """Stop what we started; returns the names of the services that were stopped."""
        if not (self.dir / "state.json").exists():
            return []
        state = self._state()
        stopped = []
        if "pgbouncer_port" in state and pgbouncer.stop(self._bouncer(state, self._pg(state))):
            stopped.append("pgbouncer")
        if "replica_port" in state and standby.stop(self._replica(state)):
            stopped.append("replica")
        if kafka.stop(self._kafka(state)):
            stopped.append("kafka")
        if postgres.stop(self._pg(state)):
            stopped.append("postgres")
        return stopped

    def status(self) -> StackStatus:
        """How the stack stands; changes nothing (a stale pid file is reported in `stale`, kept)."""
        state = self._state()
        node = self._kafka(state)
        cluster = self._pg(state)
        bouncer = self._bouncer(state, cluster) if "pgbouncer_port" in state else None
        replica = self._replica(state) if "replica_port" in state else None
        stale: dict[str, Path] = {}

        def pid(service: str, pid_file: Path, marker: Path) -> int | None:
            found = read_pid(pid_file, service, str(marker), keep_stale=True)
            if found is None and pid_file.exists():
                stale[service] = pid_file
            return found

        return StackStatus(
            postgres_pid=pid("postgres", cluster.pid_file, cluster.data_dir),
            kafka_pid=pid("kafka", node.pid_file, node.config),
            postgres_port=int(str(state["pg_port"])),
            kafka_port=node.port,
            env_file=self.env_file,
            pgbouncer_pid=pid("pgbouncer", bouncer.pid_file, bouncer.config) if bouncer else None,
            pgbouncer_port=bouncer.port if bouncer else None,
            kafka_sasl_port=int(str(state["kafka_sasl_port"])) if "kafka_sasl_port" in state else None,
            replica_pid=pid("replica", replica.pid_file, replica.data_dir) if replica else None,
            replica_port=replica.port if replica else None,
            stale=stale,
        )

    def env(self) -> dict[str, str]:
        """The connection settings written by ``up`` (:func:`read_env_file`)."""
        return read_env_file(self.env_file)

    def restart_postgres_immediate(self) -> None:
        """Crash-restart PostgreSQL (fault injection)."""
        state = self._state()
        postgres.restart_immediate(self._pg(state), str(state["pg_admin_password"]))

    def restart_kafka(self) -> None:
        """Stop and start the broker (fault injection)."""
        state = self._state()
        node = self._kafka(state)
        kafka.stop(node)
        kafka.start(node)
