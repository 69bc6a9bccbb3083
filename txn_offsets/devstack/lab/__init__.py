"""The lab: a production-shaped cluster on one machine, each host a network namespace of its own.

``make lab-up`` (``python -m txn_offsets.devstack.lab up``, root) builds it from nothing: a switch
namespace with a bridge and the hosts kafka-1..3, pg-1, pg-2, spark-master, worker-1, worker-2 and
driver on 10.47.45.0/24 (:mod:`.hosts`, :mod:`.net`); three Kafka nodes in one KRaft quorum with
replication 3 (:mod:`.kafka3`); a PostgreSQL primary, its streaming replica and PgBouncer
(:mod:`.pg`); a Spark standalone master and two workers that see neither txn_offsets nor the venv
and run a plain Python (:mod:`.spark`, :mod:`.spawn`). It waits until each answers, then writes the
connection settings as the driver host sees them to ``<lab>/env``. ``make lab-down`` kills every
process of every host, deletes the namespaces and the names, and fails naming anything left.
:mod:`.faults` does to hosts what a real cluster's network and machines do.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from txn_offsets.devstack import kafka, postgres, write_env_file
from txn_offsets.devstack._proc import cmdline, pid_alive, read_pid
from txn_offsets.devstack.lab import faults, kafka3, pg, spark
from txn_offsets.devstack.lab.net import Network
from txn_offsets.devstack.lab.spawn import hidden_paths, node_python
from txn_offsets.errors import StackError

__all__ = ["Lab", "Up"]

SERVICE = "lab"


@dataclass(frozen=True)
class Up:
    """What ``up`` started and how long it took."""

    seconds: float
    env_file: Path
    workers: list[str]


class Lab:
    """One lab, its files in `lab_dir` (default ``./.lab``: ``run/`` is rebuilt by every ``up``)."""

    def __init__(self, lab_dir: Path, net: Network | None = None) -> None:
        self.dir = lab_dir.resolve()
        self.net = net or Network()

    @property
    def run_dir(self) -> Path:
        return self.dir / "run"

    @property
    def env_file(self) -> Path:
        return self.dir / "env"

    def _preflight(self) -> str:
        if os.geteuid() != 0:
            raise StackError(
                SERVICE, "the lab needs root (network namespaces, mounts)", "run it as root (sudo)"
            )
        for tool in ("ip", "bridge", "mount"):
            if shutil.which(tool) is None:
                raise StackError(
                    SERVICE, f"`{tool}` is not installed", "install iproute2 and mount (util-linux)"
                )
        left = self.net.leftovers(str(self.run_dir))
        if left:
            raise StackError(
                SERVICE, f"an earlier lab is still there: {'; '.join(left)}", "run `make lab-down` first"
            )
        self.net.check_subnet()
        python = node_python()
        kafka.java_binary()
        return python

    def up(self) -> Up:
        """Build the lab from nothing and wait until every service answers; on any failure remove
        what was built (the logs stay in ``run/``) and raise."""
        started = time.monotonic()
        python = self._preflight()
        libs = kafka.ensure_libs()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        pg.remove_data(self.run_dir)
        self.env_file.unlink(missing_ok=True)
        self.run_dir.mkdir(parents=True)
        secret = {k: secrets.token_urlsafe(24) for k in ("admin", "app", "run")}
        fd = os.open(self.run_dir / "state.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(secret, fh)
        nodes = kafka3.nodes(self.net, self.run_dir, libs, kafka.kafka_uuid())
        daemons = spark.Daemons(self.net, self.run_dir, python, hidden_paths(python))
        servers = pg.Servers(self.net, self.run_dir)
        try:
            self.net.create()
            kafka_pids = kafka3.launch(self.net, nodes)
            spark_pids = daemons.launch()
            servers.start(secret["admin"], secret["app"], secret["run"])
            kafka3.wait_ready(self.net, nodes, kafka_pids)
            daemons.wait_ready(spark_pids)
            self._write_env(secret, python)
        except BaseException:
            self.net.remove(str(self.run_dir))
            raise
        return Up(time.monotonic() - started, self.env_file, daemons.alive_workers())

    def _write_env(self, secret: dict[str, str], python: str) -> None:
        db = postgres.APP_DB

        def url(user: str, password: str, host: str = pg.PRIMARY, port: int = pg.PORT) -> str:
            return f"postgresql+psycopg://{user}:{password}@{host}:{port}/{db}"

        app = secret["app"]
        write_env_file(
            self.env_file,
            [
                f"TXN_OFFSETS_DATABASE_URL={url(postgres.RUN_USER, secret['run'])}",
                f"TXN_OFFSETS_OWNER_DATABASE_URL={url(postgres.APP_USER, app)}",
                f"TXN_OFFSETS_ADMIN_DATABASE_URL={url(postgres.ADMIN_USER, secret['admin'])}",
                f"TXN_OFFSETS_POOLED_DATABASE_URL={url(postgres.APP_USER, app, port=pg.BOUNCER_PORT)}",
                f"TXN_OFFSETS_REPLICA_DATABASE_URL={url(postgres.APP_USER, app, host=pg.REPLICA)}",
                f"TXN_OFFSETS_KAFKA_BOOTSTRAP={kafka3.bootstrap(self.net)}",
                f"LAB_SPARK_MASTER={spark.master_url(self.net)}",
                f"LAB_NODE_PYTHON={python}",
                f"LAB_DIR={self.dir}",
            ],
        )

    def down(self) -> int:
        """Kill every lab process, delete the namespaces and /etc/netns names, and the servers'
        data if it lies outside the lab's directory; the number of namespaces there were. Raises
        naming whatever is still left. The lab's directory stays (logs) until the next ``up``."""
        before = len(self.net.namespaces())
        if before and self.run_dir.is_dir():
            pg.Servers(self.net, self.run_dir).quit()
        left = self.net.remove(str(self.run_dir))
        pg.remove_data(self.run_dir)  # kept outside the lab's directory (its OS user could not enter it)
        if left:
            raise StackError(
                SERVICE,
                f"still there after lab-down: {'; '.join(left)}",
                "remove them by hand (ip netns, kill)",
            )
        return before

    def status(self) -> tuple[list[str], bool]:
        """One line per host (namespace, bridge port, processes) and per service (pid, state);
        True when every one is up. Changes nothing."""
        lines: list[str] = []
        ok = True
        existing = set(self.net.namespaces())
        for host in self.net.hosts:
            ns = self.net.netns(host)
            if ns not in existing:
                lines.append(f"host    {host.name:13} {host.address:12} missing")
                ok = False
                continue
            port = faults.port_state(self.net, host.name) if self.net.switch in existing else "no switch"
            count = len(self.net.pids(ns))
            lines.append(f"host    {host.name:13} {host.address:12} port {port:10} {count} processes")
            ok &= port == "forwarding"
        for name, pid in self._service_pids().items():
            state = f"running (pid {pid})" if pid else "stopped"
            lines.append(f"service {name:22} {state}")
            ok &= pid is not None
        return lines, ok

    def _service_pids(self) -> dict[str, int | None]:
        found: dict[str, int | None] = {}
        for node in kafka3.nodes(self.net, self.run_dir, Path(), "-"):
            name = f"kafka {kafka3.host_of(self.net, node)}"
            found[name] = read_pid(node.pid_file, "kafka", str(node.config), keep_stale=True)
        if self.run_dir.is_dir():
            found |= pg.Servers(self.net, self.run_dir).pids()
        for host in [h for h in self.net.hosts if h.role.startswith("spark")]:
            pid_file = self.run_dir / host.name / "spark.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            mine = pid is not None and pid_alive(pid) and str(self.run_dir) in cmdline(pid)
            found[f"spark {host.name}"] = pid if mine else None
        return found
