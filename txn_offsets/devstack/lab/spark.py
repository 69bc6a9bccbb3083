"""A Spark standalone master and two workers on lab hosts of their own, from the pyspark distribution.

The daemons are the devstack's (:mod:`..cluster`: ``spark-class`` master/worker command lines and
environment) run through ``ip netns exec`` on their hosts. A worker runs in the worker view
(:class:`.spawn.View`): the distribution at the lab's ``spark-home``, no txn_offsets, no venv, and
the nodes' plain Python (``PYSPARK_PYTHON``); its executors inherit all of it. One core and a small
memory each: the machine is shared.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from txn_offsets.devstack import cluster
from txn_offsets.devstack._proc import pid_alive
from txn_offsets.devstack.lab.net import Network
from txn_offsets.devstack.lab.spawn import View, entered, plain_env, spawn_in
from txn_offsets.errors import StackError

__all__ = ["MASTER_PORT", "Daemons", "master_url"]

SERVICE = "spark"
MASTER = "spark-master"
MASTER_PORT = 7077
MASTER_WEBUI = 8080
WORKER_WEBUI = 8081
WORKER_MEMORY = "640m"
DAEMON_MEMORY = "256m"


def master_url(net: Network, *, by_name: bool = True) -> str:
    """``spark://spark-master:7077`` (the name every lab host resolves), or by address."""
    host = net.host(MASTER)
    return f"spark://{host.name if by_name else host.address}:{MASTER_PORT}"


class Daemons:
    """The master and the workers (every ``spark-worker`` host), files under ``run_dir/<host>``."""

    def __init__(self, net: Network, run_dir: Path, node_python: str, hidden: tuple[Path, ...]) -> None:
        self.net = net
        self.run_dir = run_dir
        self.node_python = node_python
        self.workers = [h.name for h in net.hosts if h.role == "spark-worker"]
        self.view = View(cluster.spark_home(), run_dir / "spark-home", hidden)

    def pid_file(self, name: str) -> Path:
        return self.run_dir / name / "spark.pid"

    def _env(self, name: str, home: Path) -> dict[str, str]:
        base = self.run_dir / name
        tmp = base / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return plain_env(
            {
                **cluster.daemon_env(self.net.host(name).address, self.node_python, home),
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={tmp}",
                "SPARK_LOCAL_DIRS": str(base / "local"),
                "SPARK_LOG_DIR": str(base),
                "SPARK_PID_DIR": str(base),
            }
        )

    def launch(self) -> dict[str, int]:
        """Start the master, then the workers (they retry until the master answers); name -> pid."""
        self.view.spark_home.mkdir(parents=True, exist_ok=True)
        pids = {}
        address = self.net.host(MASTER).address
        argv = [str(cluster.spark_home() / "bin" / "spark-class"),
                *cluster.master_argv(address, MASTER_PORT, MASTER_WEBUI)]  # fmt: skip
        pids[MASTER] = self._spawn(MASTER, argv, cluster.spark_home(), None)
        for name in self.workers:
            pids[name] = self._start_worker(name)
        return pids

    def _start_worker(self, name: str) -> int:
        work = self.run_dir / name / "work"
        work.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.view.spark_home / "bin" / "spark-class"),
            *cluster.worker_argv(master_url(self.net, by_name=False), self.net.host(name).address, cores=1,
                                 memory=WORKER_MEMORY, webui_port=WORKER_WEBUI, work_dir=work),
        ]  # fmt: skip
        return self._spawn(name, argv, self.view.spark_home, self.view)

    def restart_worker(self, name: str, timeout_s: float = 180) -> float:
        """Start worker `name` again (after its host was killed and healed); seconds until it
        logs its registration (the master may still list the dead one ALIVE for a minute)."""
        started = time.monotonic()
        log = self.run_dir / name / "spark.log"
        seen = log.stat().st_size if log.exists() else 0
        pid = self._start_worker(name)
        while time.monotonic() - started < timeout_s:
            if not pid_alive(pid):
                raise StackError(SERVICE, f"{name} exited on restart", f"read {log}")
            with log.open("rb") as fh:
                fh.seek(seen)
                if b"Successfully registered with master" in fh.read():
                    return time.monotonic() - started
            time.sleep(1)
        raise StackError(SERVICE, f"{name} not registered {timeout_s:.0f}s after its restart", f"read {log}")

    def _spawn(self, name: str, argv: list[str], home: Path, view: View | None) -> int:
        env = self._env(name, home)
        log = self.run_dir / name / "spark.log"
        pid = spawn_in(self.net, name, argv, env=env, log=log, cwd=self.run_dir / name, view=view)
        self.pid_file(name).write_text(f"{pid}\n")
        return pid

    def alive_workers(self) -> list[str]:
        """The workers the master lists as ALIVE (host addresses), asked from the driver host."""
        url = f"http://{self.net.host(MASTER).address}:{MASTER_WEBUI}/json/"
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with entered(self.net, "driver"), direct.open(url, timeout=5) as answer:
            state = json.load(answer)
        return sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_ready(self, pids: dict[str, int], timeout_s: float = 240) -> None:
        """Until every worker is registered (ALIVE) at the master."""
        deadline = time.monotonic() + timeout_s
        last = "the master does not answer yet"
        while time.monotonic() < deadline:
            for name, pid in pids.items():
                if not pid_alive(pid):
                    log = self.run_dir / name / "spark.log"
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    raise StackError(SERVICE, f"{name} exited during start-up:\n{tail}", f"read {log}")
            try:
                alive = self.alive_workers()
                if len(alive) >= len(self.workers):
                    return
                last = f"workers registered: {alive}"
            except OSError as exc:
                last = f"the master does not answer: {exc}"
            time.sleep(1)
        raise StackError(
            SERVICE, f"not ready after {timeout_s:.0f}s: {last}", f"read {self.run_dir}/*/spark.log"
        )
