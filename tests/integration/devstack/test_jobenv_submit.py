"""The README's job, submitted with docs/operations.md's spark-submit command and the archive
``make job-env`` builds, on a loopback standalone cluster whose two workers cannot see txn_offsets.

Each worker runs in a private mount namespace (``unshare --mount``) with the lab's worker view
(:class:`txn_offsets.devstack.lab.spawn.View`): the pyspark distribution bind-mounted read-only to a
``spark-home`` of its own, empty tmpfs over this checkout's ``txn_offsets``, its venv, the interpreter
the venv was made from and the job env's build directory. Its executors inherit the view, so
txn_offsets, psycopg and confluent-kafka can only come from the shipped ``./env``; the tasks report
where they found txn_offsets. The stack is a private one started by the README's own shell block (as
tests/integration/spark/test_readme.py does), so the README's fixed names (topic ``sentences``,
schema ``wordcount``, job ``word-count``) start empty.

Measured 2026-11-28 on the 2-core machine shared with two other sessions: 159 s under a load of ~10
(stack 39 s, spark-submit 74 s), 4-6 min under ~20 (stack 46-55 s, spark-submit 130-138 s, a
rebuilt job env 68 s): marked ``lab`` (``make test-lab``), over make test's budget.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.spark.test_readme import SENTENCES, UNCONFINED, _counts, readme_blocks
from tests.unit.test_docs_submit import OPERATIONS, marked_block
from txn_offsets.devstack import cluster, postgres, read_env_file
from txn_offsets.devstack._proc import adopt, pick_free_port, port_free, stop_pid
from txn_offsets.devstack.lab import jobenv
from txn_offsets.devstack.lab.spawn import View, hidden_paths, node_python, plain_env
from txn_offsets.devstack.lab.submit import Submission, spark_submit_argv

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
#: printed by the task (appended to the documented job.py): where the executors found things
PROBE = """
import json as _json
def _where(_):
    import os, sys, psycopg, txn_offsets
    yield _json.dumps({"python": os.path.realpath(sys.executable), "txn_offsets": txn_offsets.__file__,
                       "psycopg": psycopg.__file__, "cwd": os.getcwd()})
print("PROBE", _json.dumps(spark.sparkContext.parallelize(range(2), 2).mapPartitions(_where).collect()))
"""
#: prints {path: its entries} for each argument
LISTING = "import json, os, sys; print(json.dumps({p: os.listdir(p) for p in sys.argv[1:]}))"


class ViewedCluster:
    """A master on loopback (cluster.py's daemons) and `workers` workers in the worker view."""

    #: a private mount namespace, where the view's script mounts and then execs its arguments
    WRAP = ("unshare", "--mount", "--propagation", "private", "sh", "-c")

    def __init__(self, workdir: Path, python: str, hidden: tuple[Path, ...], workers: int = 2) -> None:
        self.workdir, self.python, self.workers = workdir, python, workers
        self.view = View(cluster.spark_home(), workdir / "spark-home", hidden)
        self.port = pick_free_port()
        self.pids: list[int] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, argv: list[str], home: Path) -> None:
        env = plain_env({**cluster.daemon_env("127.0.0.1", self.python, home), "SPARK_DAEMON_MEMORY": "256m",
                         "SPARK_LOCAL_DIRS": str(self.workdir / name / "local")})  # fmt: skip
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.workdir, start_new_session=True)  # fmt: skip
        adopt(proc)
        self.pids.append(proc.pid)

    def __enter__(self) -> ViewedCluster:
        self.view.spark_home.mkdir(parents=True)
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        home = cluster.spark_home()
        master = cluster.master_argv("127.0.0.1", self.port, pick_free_port())
        self._spawn("master", [str(home / "bin" / "spark-class"), *master], home)
        self._wait(lambda: not port_free(self.port), "the master to listen")
        for i in range(self.workers):
            work = self.workdir / f"work-{i}"
            worker = cluster.worker_argv(
                self.master_url, "127.0.0.1", cores=1, memory="1g", webui_port=pick_free_port(), work_dir=work
            )
            inside = [str(self.view.spark_home / "bin" / "spark-class"), *worker]
            argv = [*self.WRAP, self.view.script(), "view", *inside]
            self._spawn(f"worker-{i}", argv, self.view.spark_home)
        log = self.workdir / "master.log"
        self._wait(lambda: log.read_text(errors="replace").count("Registering worker") >= self.workers,
                   f"{self.workers} workers to register")  # fmt: skip

    def _wait(self, ready: object, what: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if callable(ready) and ready():
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text(errors="replace")[-1500:] for p in self.workdir.glob("*.log")}
        raise AssertionError(f"timed out waiting for {what}: {logs}")

    def __exit__(self, *exc: object) -> None:
        for pid in reversed(self.pids):
            stop_pid(pid, timeout_s=30)


def _sh(
    script: str, cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty directory with this checkout's venv first on PATH (the driver's virtualenv)."""
    assert os.geteuid() == 0, "the worker view needs root (unshare --mount, mount)"
    assert shutil.which("unshare") and shutil.which("mount"), (
        "the worker view needs util-linux (unshare, mount)"
    )
    root = tmp_path / "wordcount"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "TXN_OFFSETS_", "SPARK_"))}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    try:
        yield root, env
    finally:  # the private stack stops whatever happened; its cluster data goes with it
        down = _sh("txn-offsets dev down", root, env, timeout=180)
        data = postgres.cluster_for(root / ".stack", 1).data_dir.parent
        if not data.is_relative_to(tmp_path):
            shutil.rmtree(data.parent, ignore_errors=True)
        assert down.returncode == 0, down.stderr


def test_the_readme_job_runs_from_the_packed_env_with_the_documented_command(
    project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = project
    figures: dict[str, float] = {}
    started = time.monotonic()
    built = jobenv.build(REPO, REPO / "dist" / "job-env.tar.gz")
    figures["job env"] = time.monotonic() - started

    # the README's stack, topic, table and grants: its shell block but the last line (the local run)
    blocks = {marker: code for marker, _, code in readme_blocks()}
    (root / "setup_wordcount.py").write_text(blocks["usage-file setup_wordcount.py"])
    setup, _, local_run = blocks["usage-shell"].rstrip("\n").rpartition("\n")
    assert local_run.startswith("python wordcount.py"), local_run
    started = time.monotonic()
    done = _sh(setup, root, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures["stack"] = time.monotonic() - started

    # the cluster section's files and its zip line, as printed
    (root / "myjobs").mkdir()
    (root / "myjobs" / "__init__.py").write_text("")
    (root / "myjobs" / "wordcount.py").write_text(
        marked_block(OPERATIONS, "cluster-file myjobs/wordcount.py")
    )
    (root / "job.py").write_text(marked_block(OPERATIONS, "cluster-file job.py") + PROBE)
    (zip_line,) = [ln for ln in marked_block(OPERATIONS, "cluster-submit").splitlines() if "zipfile" in ln]
    zipped = _sh(zip_line, root, env)
    assert zipped.returncode == 0, zipped.stderr

    python = node_python()
    hidden = hidden_paths(python, also=(REPO / "build" / "job-env",))
    # the control: what the worker view hides is there outside it and empty inside it
    view = View(cluster.spark_home(), tmp_path / "probe-home", hidden)
    view.spark_home.mkdir()
    listing = [python, "-c", LISTING, *map(str, hidden)]
    outside = subprocess.run(listing, capture_output=True, text=True, timeout=60, check=True)
    inside = subprocess.run([*ViewedCluster.WRAP, view.script(), "view", *listing], capture_output=True,
                            text=True, timeout=60, check=True)  # fmt: skip
    assert all(json.loads(outside.stdout).values()), outside.stdout
    assert json.loads(inside.stdout) == {str(p): [] for p in hidden}, inside.stdout
    with ViewedCluster(tmp_path / "spark", python, hidden) as spark:
        sub = Submission(master=spark.master_url, job="job.py", archive=str(built.report.path),
                         driver_python=sys.executable, py_files=("myjobs.zip",))  # fmt: skip
        run_env = {**env, **read_env_file(root / ".stack" / "env"), "SPARK_LOCAL_IP": "127.0.0.1"}
        started = time.monotonic()
        argv = spark_submit_argv(sub, spark_submit=str(VENV_BIN / "spark-submit"))
        submitted = subprocess.run(argv, cwd=root, env=run_env, capture_output=True, text=True, timeout=900,
                                   check=False)  # fmt: skip
        figures["spark-submit"] = time.monotonic() - started
    print(f"\njob env {built.report.describe()}; figures (s): {json.dumps(figures)}")

    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-6000:]
    assert UNCONFINED not in submitted.stderr, submitted.stderr[-3000:]
    out = submitted.stdout.splitlines()
    assert f"{len(SENTENCES)} records counted exactly once in 1 batches" in out, out

    # the tasks ran on the executors, from the unpacked env, on the node Python
    (probe,) = [json.loads(ln.removeprefix("PROBE ")) for ln in out if ln.startswith("PROBE ")]
    assert len(probe) == 2
    for task in map(json.loads, probe):
        assert re.fullmatch(rf"{tmp_path}/spark/work-\d/app-[^/]+/\d+", task["cwd"]), task
        for module in ("txn_offsets", "psycopg"):
            site = f"{task['cwd']}/env/lib/python3.{sys.version_info[1]}/site-packages"
            assert task[module] == f"{site}/{module}/__init__.py", task
        assert task["python"] == os.path.realpath(python), task

    stack = types.SimpleNamespace(stack_env=lambda: read_env_file(root / ".stack" / "env"))
    words = collections.Counter(w for s in SENTENCES for w in s.split())
    assert _counts(stack) == (dict(words), {"word-count": len(SENTENCES)})  # type: ignore[arg-type]
