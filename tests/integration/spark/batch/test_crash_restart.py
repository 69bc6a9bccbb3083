"""A job restarted right after its driver was killed (SIGKILL) runs at once and counts exactly
(issue 44, item 8): the dead driver's process on this host is provably gone, so the new run takes
the job over instead of waiting out the lease; while that driver was alive, a start was refused
with when the lease expires and what sets its length. Before, the restart was refused with
JobAlreadyRunning until the lease expired (up to `lease_s`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fix_services import REPO
from tests.integration.spark.counting import Counting
from txn_offsets.errors import JobAlreadyRunning
from txn_offsets.plan.planner import Limits
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

LEASE_S = 120.0  # the restart below must not wait for it


def test_a_killed_job_restarted_at_once_runs_and_is_exact(counting: Counting, database_url: str) -> None:
    topic, expected = counting.topic(2, 4_000)  # 20 batches of 2 x 100 records
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_SCHEMA": counting.db.schema,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": counting.kafka.bootstrap_servers,
        "PYTHONPATH": str(REPO),
    }
    argv = [counting.job, topic, counting.db.schema, counting.table, str(LEASE_S)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.spark.batch.crash_job", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            if sum(counting.offsets().values()) >= 400:  # a few batches committed
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        with pytest.raises(JobAlreadyRunning) as info:  # a live holder is refused, and told when
            start_run(Store(counting.engine, counting.db), counting.job)
        assert info.value.lease_s == LEASE_S and info.value.lease_left_s is not None
        assert f"its process {proc.pid} is running on this host). Stop that run" in str(info.value)
        assert "its lease expires in " in str(info.value)
        proc.send_signal(signal.SIGKILL)  # mid-run: a batch may be reading or committing
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert sum(counting.offsets().values()) < 4_000, "the job finished before it was killed"
    began = time.monotonic()
    summary = counting.run(topic, start=None, limits=Limits(max_records_per_partition=1_000))
    assert time.monotonic() - began < LEASE_S / 2  # it did not wait for the lease
    assert summary.generation == 2  # the takeover bumped the generation: the dead run is fenced
    counting.assert_exact(topic, 2, expected)
