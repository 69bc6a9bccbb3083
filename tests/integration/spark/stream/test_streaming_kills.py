"""The streaming adapter survives a kill -9 mid-batch of the Spark Connect client and of the Spark
Connect server: a new client (a new run, fencing the old one) finishes the job with exact results.

Each kill lands while a batch's transaction is open (results written, offsets claimed, not yet
committed): the test waits until PostgreSQL shows the batch's write running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import Counting
from tests.integration.spark.stream.stream_process import SLOW_WRITE

REPO = Path(__file__).resolve().parents[4]


class Processes:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"proc-{len(self.started)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.spark.stream.stream_process", *args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def server(self, name: str) -> tuple[subprocess.Popen[bytes], str]:
        proc = self.start("serve", str(self.tmp / f"{name}.url"))
        return proc, self.wait_for_server(proc, name)

    def wait_for_server(self, proc: subprocess.Popen[bytes], name: str) -> str:
        """The URL file of the Connect server `proc` started as `name`, once it wrote it."""
        url_file = self.tmp / f"{name}.url"
        deadline = time.monotonic() + 180
        while not url_file.exists():
            assert proc.poll() is None, self.logs()
            assert time.monotonic() < deadline, "the Connect server did not start"
            time.sleep(0.5)
        return str(url_file)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("proc-*.log")))

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def processes(tmp_path: Path, database_url: str, kafka_bootstrap: str) -> Iterator[Processes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = Processes(tmp_path, env)
    yield procs
    procs.kill_all()


def wait_for_open_write(engine: sa.Engine, timeout_s: float = 240.0) -> None:
    """Until a batch's transaction is inside its (slow) write: results written, not committed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            active = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = :q"),
                {"q": SLOW_WRITE},
            ).scalar_one()
        if active:
            return
        time.sleep(0.05)
    raise AssertionError("no batch reached its write")


# make test kills the Connect server mid-batch (the harder case: the sink's transaction dies with
# it); killing the client instead is the same recovery from the table and runs with the slow ones
@pytest.mark.parametrize("victim", [pytest.param("client", marks=pytest.mark.slow), "server"])
def test_stream_survives_kill9_mid_batch(
    victim: str, processes: Processes, counting_no_spark: Counting, tmp_path: Path
) -> None:
    topic, _ = counting_no_spark.topic(2)
    expected = counting_no_spark.produce(
        topic, 750, 2
    )  # 5 batches of 150: killed inside one of the last three
    ends = counting_no_spark.ends(topic, 2)
    client_args = (
        "client",
        counting_no_spark.job,
        topic,
        counting_no_spark.db.schema,
        counting_no_spark.table,
        str(tmp_path / "checkpoints"),
    )
    server, url = processes.server("first")
    first = processes.start(client_args[0], url, *client_args[1:])
    # the server the second client will use starts now, while the first works (a JVM start, ~10 s)
    spare = processes.start("serve", str(tmp_path / "second.url")) if victim == "server" else None
    # let a few batches commit, then kill inside a batch's open transaction
    deadline = time.monotonic() + 240
    while sum(counting_no_spark.offsets().values()) < 300:
        assert first.poll() is None, processes.logs()
        assert time.monotonic() < deadline, processes.logs()
        time.sleep(0.2)
    wait_for_open_write(counting_no_spark.engine)
    if victim == "client":
        os.killpg(first.pid, signal.SIGKILL)  # the query goes on in the server, an orphan
    else:
        os.killpg(server.pid, signal.SIGKILL)
        os.killpg(first.pid, signal.SIGKILL)
        assert spare is not None
        url = processes.wait_for_server(spare, "second")
    assert counting_no_spark.offsets() != ends  # the kill left work to do
    second = processes.start(client_args[0], url, *client_args[1:])
    assert second.wait(360) == 0, processes.logs()
    assert counting_no_spark.totals() == dict(expected)
    assert counting_no_spark.offsets() == ends
