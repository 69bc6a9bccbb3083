"""A Spark standalone cluster on loopback (one master, N workers) started with the pyspark
distribution's `spark-class`: for tests and for trying the cluster path without a real cluster.

The daemons' environment and command lines (:func:`daemon_env`, :func:`master_argv`,
:func:`worker_argv`) serve the lab's master and workers on hosts of their own too."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from txn_offsets._java import find_java
from txn_offsets.devstack._proc import adopt, pick_free_port, port_free, stop_pid
from txn_offsets.errors import StackError

__all__ = ["StandaloneCluster"]

logger = logging.getLogger(__name__)


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def daemon_env(local_ip: str, python: str, home: Path | None = None) -> dict[str, str]:
    """What a master or worker daemon needs besides the caller's environment: the distribution
    (`home`, default :func:`spark_home`), java, its address, the executors' Python, no daemonizing."""
    java = find_java()
    return {
        "SPARK_HOME": str(home or spark_home()),
        "JAVA_HOME": os.environ.get("JAVA_HOME", str(Path(java).resolve().parent.parent)),
        "SPARK_LOCAL_IP": local_ip,
        "SPARK_MASTER_HOST": local_ip,
        "PYSPARK_PYTHON": python,
        "SPARK_NO_DAEMONIZE": "1",
    }


def master_argv(host: str, port: int, webui_port: int) -> list[str]:
    """spark-class's arguments for a master on host:port."""
    return ["org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port),
            "--webui-port", str(webui_port)]  # fmt: skip


def worker_argv(
    master_url: str, host: str, *, cores: int, memory: str, webui_port: int, work_dir: Path
) -> list[str]:
    """spark-class's arguments for a worker on `host` offering `cores` and `memory` to the master."""
    return ["org.apache.spark.deploy.worker.Worker", master_url, "--host", host, "--cores", str(cores),
            "--memory", memory, "--webui-port", str(webui_port), "--work-dir", str(work_dir)]  # fmt: skip


class StandaloneCluster:
    """``with StandaloneCluster(workdir, workers=2) as master_url: ...`` - stopped (by pid) on exit."""

    def __init__(
        self,
        workdir: Path,
        *,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory: str = "1g",
        worker_hosts: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise StackError("spark", f"workers must be >= 1, got {workers}", "ask for at least one worker")
        hosts = list(worker_hosts) if worker_hosts else ["127.0.0.1"] * workers
        if len(hosts) != workers or not all(h.startswith("127.") for h in hosts):
            raise StackError(
                "spark",
                f"worker_hosts {hosts!r} must name {workers} loopback address(es)",
                "give one 127.x.y.z address per worker (distinct ones make Spark see distinct hosts)",
            )
        self.hosts = hosts
        self.extra_env = dict(env or {})
        self.workdir = workdir
        self.workers = workers
        self.cores = cores_per_worker
        self.memory = memory
        self.port = pick_free_port()
        self._pids: list[int] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        # executors must import the same installed txn_offsets as the driver: its interpreter
        return {**os.environ, **daemon_env("127.0.0.1", sys.executable), **self.extra_env}

    def _spawn(self, name: str, *args: str) -> int:
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env(),
            cwd=self.workdir,
            start_new_session=True,
        )
        log.close()
        adopt(proc)
        self._pids.append(proc.pid)
        return proc.pid

    def __enter__(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("master", *master_argv("127.0.0.1", self.port, pick_free_port()))
        self._wait(lambda: not port_free(self.port), "the master to listen")
        for i in range(self.workers):
            argv = worker_argv(self.master_url, self.hosts[i], cores=self.cores, memory=self.memory,
                               webui_port=pick_free_port(), work_dir=self.workdir / f"work-{i}")  # fmt: skip
            self._spawn(f"worker-{i}", *argv)
        self._wait(self._workers_registered, f"{self.workers} workers to register")
        logger.info("spark standalone cluster up at %s with %d workers", self.master_url, self.workers)
        return self.master_url

    def _workers_registered(self) -> bool:
        log = self.workdir / "master.log"
        return log.exists() and log.read_text(errors="replace").count("Registering worker") >= self.workers

    def _wait(self, ready: object, what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if callable(ready) and ready():
                return
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise StackError("spark", f"timed out waiting for {what}", f"read the logs in {self.workdir}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for pid in reversed(self._pids):
            stop_pid(pid, timeout_s=20)
        self._pids.clear()
