"""A BatchWriter's next batch computed while the driver commits this one (txn_offsets.spark.read_ahead):
overlapped, never two computes at once, dropped - never written - when the batch before it fails."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import Counting, counts_table_of, key_of
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark import runner
from txn_offsets.spark.writers import BatchWriter
from txn_offsets.upserts import upsert_add

LIMITS = Limits(max_records_per_batch=1_000)  # 4,000 records: 4 full batches


@pytest.fixture(autouse=True)
def planned_from_the_last_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch after the first planned from the last one's plan (on a loaded machine, 4
    batches may take longer than REPLAN_EVERY_S: the batch after a fresh plan is not computed ahead)."""
    monkeypatch.setattr(runner, "REPLAN_EVERY_S", 600.0)


class Recorder:
    """A BatchWriter over the counts table that records what ran when: ("compute", i) as the i-th
    compute starts, ("write", i) as the write of the batch the i-th compute computed ends. The
    write of a compute before `wait_for` waits (at most 20 s) for the next compute to start, so a
    run that computes ahead shows it in the order of events; `fail_write` / `fail_compute` make the
    write of that batch (always), or that compute (once), fail."""

    def __init__(
        self,
        table: str,
        *,
        wait_for: int = 0,
        fail_write: int = 0,
        fail_compute: int = 0,
        slow: int = 0,
        frame: bool = False,
    ) -> None:
        self.table = table
        self.events: list[tuple[str, int]] = []
        self.computes = 0
        self.running = 0  # computes running at once, at most
        self.most_at_once = 0
        self.wait_for = wait_for
        self.fail_write, self.fail_compute = fail_write, fail_compute
        self.slow = slow  # this compute's Spark job sleeps 45 s in its tasks
        self.frame = frame  # compute_df (any session) instead of compute (an RDD: classic only)
        self.changed = threading.Condition()

    def compute(self, records: Any) -> tuple[int, list[tuple[str, int]]]:
        with self.changed:
            self.computes += 1
            i = self.computes
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.events.append(("compute", i))
            self.changed.notify_all()
        try:
            if i == self.fail_compute:
                self.fail_compute = 0  # once
                raise ValueError(f"compute {i} failed on purpose")
            if i == self.slow:
                _sleep_long(records, self.frame)
            if self.frame:
                counted = records.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
                return i, [(str(r.k), int(r["count"])) for r in counted]
            rows: list[tuple[str, int]] = (
                records.map(lambda r: (key_of(r), 1)).reduceByKey(operator.add, 2).collect()
            )
            return i, rows
        finally:
            with self.changed:
                self.running -= 1

    def write(
        self, conn: sa.Connection, ranges: Sequence[OffsetRange], result: tuple[int, list[tuple[str, int]]]
    ) -> None:
        i, rows = result
        upsert_add(
            conn, counts_table_of(self.table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"]
        )
        with self.changed:
            if i < self.wait_for:
                self.changed.wait_for(lambda: self.computes > i, timeout=20.0)
            self.events.append(("write", i))
        if i == self.fail_write:
            raise ValueError(f"write {i} failed on purpose")

    def writer(self) -> BatchWriter[tuple[int, list[tuple[str, int]]]]:
        if self.frame:
            return BatchWriter(compute_df=self.compute, write=self.write)
        return BatchWriter(compute=self.compute, write=self.write)


def _sleep_long(records: Any, frame: bool) -> None:
    """A Spark job over `records` whose tasks sleep 45 s (unless cancelled)."""

    def sleep_rows(batches: Any) -> Any:
        time.sleep(45)
        yield from batches

    if frame:
        records.mapInArrow(sleep_rows, records.schema).collect()
    else:
        records.mapPartitions(lambda rows: (time.sleep(45), list(rows))[1]).count()


def _read_ahead_threads() -> list[threading.Thread]:
    """The read-ahead threads still running after 5 s (a dropped compute's thread ends just after
    the drop saw it done)."""
    running = [t for t in threading.enumerate() if t.name.startswith("read-ahead-")]
    for t in running:
        t.join(timeout=5)
    return [t for t in running if t.is_alive()]


@pytest.fixture(params=["classic", "connect"])
def on(request: pytest.FixtureRequest) -> tuple[Any, bool]:
    """The session a test's job runs on and whether its compute is compute_df: classic Spark with an
    RDD compute, or Spark Connect with compute_df."""
    if request.param == "classic":
        return request.getfixturevalue("spark"), False
    return request.getfixturevalue("connect_spark"), True


def test_the_next_batch_is_computed_while_this_one_commits(counting: Counting, on: tuple[Any, bool]) -> None:
    session, frame = on
    topic, expected = counting.topic(4, 4_000)
    recorder = Recorder(counting.table, wait_for=4, frame=frame)
    summary = counting.run(topic, writer=recorder.writer(), limits=LIMITS, session=session)
    counting.assert_exact(topic, 4, expected)
    assert summary.batches == 4 and summary.records == 4_000
    # every write but the last ended after the next batch's compute had started; the last batch
    # was not full, so nothing was computed after it
    assert recorder.events == [
        ("compute", 1),
        ("compute", 2),
        ("write", 1),
        ("compute", 3),
        ("write", 2),
        ("compute", 4),
        ("write", 3),
        ("write", 4),
    ]
    assert recorder.computes == 4
    assert recorder.most_at_once == 1  # computes never overlap one another


def test_a_batch_computed_ahead_of_a_failed_commit_is_dropped(counting: Counting) -> None:
    topic, expected = counting.topic(4, 4_000)
    failing = Recorder(counting.table, fail_write=2)
    with pytest.raises(TxnOffsetsError):
        counting.run(topic, writer=failing.writer(), limits=LIMITS, retries=0)
    # batch 3 was computed while batch 2 committed; batch 2 did not commit, batch 3 was never written
    assert failing.computes == 3
    assert [e for e in failing.events if e[0] == "write"] == [("write", 1), ("write", 2)]
    assert sum(counting.totals().values()) == sum(counting.offsets().values()) == 1_000  # batch 1 alone
    assert not _read_ahead_threads()
    # the job runs again from the table: every record once
    summary = counting.run(topic, writer=Recorder(counting.table).writer(), limits=LIMITS)
    counting.assert_exact(topic, 4, expected)
    assert summary.records == 3_000


def test_a_compute_that_failed_ahead_is_retried_from_the_table(counting: Counting) -> None:
    topic, expected = counting.topic(4, 4_000)
    recorder = Recorder(counting.table, fail_compute=2)  # batch 2's compute, started ahead, fails once
    summary = counting.run(topic, writer=recorder.writer(), limits=LIMITS, retry_backoff_s=0.05)
    counting.assert_exact(topic, 4, expected)
    assert summary.batches == 4 and summary.records == 4_000
    assert recorder.computes == 5  # batch 2 computed twice: ahead (failed), then planned afresh


def test_nothing_is_computed_after_the_last_batch_of_max_batches(counting: Counting) -> None:
    topic, _expected = counting.topic(4, 4_000)
    recorder = Recorder(counting.table)
    summary = counting.run(topic, writer=recorder.writer(), limits=LIMITS, max_batches=2)
    assert summary.batches == 2
    assert recorder.computes == 2
    assert sum(counting.offsets().values()) == sum(counting.totals().values()) == 2_000


def test_a_batch_computing_ahead_of_a_failed_commit_is_cancelled(
    counting: Counting, on: tuple[Any, bool]
) -> None:
    """Batch 3's compute (a Spark job sleeping 45 s) runs in the run's job group (classic) or
    with its operation tag (Connect), so when batch 2's commit fails it is cancelled at once."""
    session, frame = on
    topic, _expected = counting.topic(4, 4_000)
    recorder = Recorder(counting.table, fail_write=2, slow=3, frame=frame)
    started = time.monotonic()
    with pytest.raises(TxnOffsetsError, match="write 2 failed on purpose"):
        counting.run(topic, writer=recorder.writer(), limits=LIMITS, session=session, retries=0)
    assert time.monotonic() - started < 25  # not the 45 s of batch 3's job, nor read_ahead.DROP_WAIT_S
    assert recorder.computes == 3 and recorder.running == 0  # batch 3's compute ended (cancelled)
    assert [e for e in recorder.events if e[0] == "write"] == [("write", 1), ("write", 2)]
    assert sum(counting.totals().values()) == sum(counting.offsets().values()) == 1_000


def test_a_batch_computed_ahead_of_a_stop_is_dropped(counting: Counting) -> None:
    """A stop (SIGTERM, or `stop` set, here by on_batch) after batch 1 committed: batch 2, computed
    while batch 1 committed, is dropped; the run ends after batch 1 and the next run goes on exact."""
    topic, expected = counting.topic(4, 4_000)
    recorder = Recorder(counting.table)
    stop = threading.Event()
    summary = counting.run(
        topic, writer=recorder.writer(), limits=LIMITS, stop=stop, on_batch=lambda _report: stop.set()
    )
    assert (summary.batches, summary.stopped_by) == (1, "signal")
    assert recorder.computes == 2 and recorder.running == 0
    assert [e for e in recorder.events if e[0] == "write"] == [("write", 1)]
    assert sum(counting.totals().values()) == sum(counting.offsets().values()) == 1_000
    assert not _read_ahead_threads()
    counting.run(topic, writer=Recorder(counting.table).writer(), limits=LIMITS)
    counting.assert_exact(topic, 4, expected)
