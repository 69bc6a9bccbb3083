"""What a long-running task of an epoch runs: follow its partitions and commit small ranges.

The task starts from the offsets stored in the table (not from the plan), so a task that Spark
retries continues where the table is: whatever its failed attempt committed stays committed once,
and nothing after it is skipped. It then polls one consumer continuously and commits each of its
partitions' new records as a range ``[committed, position)`` - once the first record has waited
``commit_interval_ms`` with nothing more buffered, or at ``commit_max_records`` - with the batch
mode's guarded claim + ``PartitionWriter`` write + advance. When one range is due, every range the
task has read joins it: all of them in one transaction
(the staging rules of :mod:`txn_offsets.commit.staging`, then the commit core).

It stops at the epoch's deadline, when the job row says the epoch ended (see :mod:`.control`), when
``until_caught_up`` and every partition reached the end the epoch was planned to, or at the first
range that did not commit:

* ``conflict`` at the run's own generation: only another copy of this task (a speculative copy, an
  attempt Spark has not killed yet) moves these offsets, so this copy stops - reported as
  ``superseded``, and the driver plans the next epoch from the table;
* ``fenced``, ``topic_changed``, ``rolled_back``, ``blocked``, a rejected record: reported with the
  error, which the driver raises (or plans again for, if transient) exactly as in batch mode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.commit import Outcome
from txn_offsets.commit.staging import Prepare, Prepared, RangesWrite, Stop, prepare_range, unit_of
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import OffsetConflict, TxnOffsetsError
from txn_offsets.kafka import recreated
from txn_offsets.kafka.follower import Follower
from txn_offsets.kafka.reader import SETTLE_TIMEOUT_S
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange, TopicPartition
from txn_offsets.spark.heap import freeze_worker_heap
from txn_offsets.spark.lowlatency.control import end_epoch, epoch_live
from txn_offsets.spark.lowlatency.options import LowLatency
from txn_offsets.spark.tasks import TaskReport, commit_reporting
from txn_offsets.store import offset_rows
from txn_offsets.store.database import worker_engine
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

__all__ = ["FollowReport", "FollowTask"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowReport:
    """What one long-running task did in its epoch (pickled back to the driver)."""

    task: int
    spans: tuple[TaskReport, ...]  # per partition: [first start, last until) committed, records
    commits: int  # transactions that committed
    already_committed: int  # transactions whose ranges another copy had committed
    stopped_by: str  # deadline | ended | caught_up | superseded | error
    error: TxnOffsetsError | None = None
    commit_ms: tuple[float, ...] = ()  # a sample of commit durations (ms), for the epoch's log line


@dataclass
class _Pending:
    committed: int  # the stored offset (next offset to read) this task last committed or read
    records: list[Record] = field(default_factory=list)
    since: float | None = None  # monotonic time the oldest uncommitted offset was seen
    first_start: int = -1
    total: int = 0


@dataclass(frozen=True)
class FollowTask:
    """The picklable body of an epoch's task: its input is the tuple of its partitions' indexes."""

    database: DatabaseSettings
    kafka: KafkaSettings
    run: Run
    partitions: tuple[TopicPartition, ...]
    ends: dict[TopicPartition, int]  # the ends the epoch was planned to (until_caught_up)
    options: LowLatency
    prepare: Prepare[Any]
    write: RangesWrite[Any]  # PartitionWriter.write_ranges
    isolation_level: str = "READ COMMITTED"
    dead_letters: bool = False
    epoch: int = 1
    until_caught_up: bool = False
    # the epoch's end, wall clock (time.time()): set by the driver, so that a task Spark retries
    # late in the epoch ends with the others instead of epoch_s after its own start
    ends_at: float | None = None

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[FollowReport]:
        keys = [self.partitions[int(i)] for group in assigned for i in group]  # read it to the end
        freeze_worker_heap()
        if keys:
            yield _Follow(self, index, keys).run()


class _Follow:
    def __init__(self, task: FollowTask, index: int, keys: list[TopicPartition]) -> None:
        self.t, self.index, self.keys = task, index, keys
        self.store = Store(worker_engine(task.database), task.database)  # built here, on the executor
        self.commits = self.already = 0
        self.commit_ms: list[float] = []
        self.topic_ids: dict[str, str] = {}

    def _stored(self) -> dict[TopicPartition, int]:
        """The stored offsets of this task's partitions, and the topic ids the planner left in the
        rows (the incarnations the claims require and the reads are checked against)."""
        with self.store.connect() as conn:
            rows = offset_rows.load_rows(conn, self.t.database, self.t.run.job)
            conn.rollback()
        self.topic_ids = {k[0]: tid for k in self.keys if (tid := rows[k].topic_id) is not None}
        return {k: rows[k].off for k in self.keys}

    def run(self) -> FollowReport:
        t, opts = self.t, self.t.options
        # the epoch's end; a task that started late (a retry, a slow worker start) still runs a
        # quarter of an epoch, or 5 s (the driver cancels only after epoch_s + max(30 s, epoch_s / 2))
        left = opts.epoch_s if t.ends_at is None else min(opts.epoch_s, t.ends_at - time.time())
        deadline = time.monotonic() + max(opts.epoch_s / 4, min(opts.epoch_s, 5.0), left)
        try:
            if not epoch_live(self.store, t.run):
                return self._report("ended")
            stored = self._stored()  # a retried task continues from the table, not the plan
            # no broker this process reaches may name another id: kafka/reader.py _settle
            recreated.settle(t.kafka, self.topic_ids, timeout_s=SETTLE_TIMEOUT_S, gone="proof")
        except TxnOffsetsError as exc:
            return self._report("error", exc)
        pending = {k: _Pending(off, first_start=off) for k, off in stored.items()}
        follower = Follower(
            t.kafka, stored, fetch_wait_ms=opts.fetch_wait_ms, batch_size=min(2000, opts.commit_max_records)
        )
        interval = opts.commit_interval_ms / 1000
        check_every = opts.check_interval_ms / 1000
        next_check = time.monotonic() + check_every
        stopped_by = "deadline"
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                if now >= next_check:
                    next_check = now + check_every
                    if not epoch_live(self.store, t.run):
                        stopped_by = "ended"
                        break
                if t.until_caught_up and all(p.committed >= t.ends.get(k, 0) for k, p in pending.items()):
                    stopped_by = "caught_up"
                    break
                waiting = [p.since for p in pending.values() if p.since is not None]
                wait = min(next_check, deadline) - now
                if waiting:
                    wait = min(wait, min(waiting) + interval - now)
                records = follower.poll(max(0.0, min(wait, 0.1)))
                now = time.monotonic()
                for rec in records:
                    pending[(rec.topic, rec.partition)].records.append(rec)
                for key, pos in follower.positions.items():
                    p = pending[key]
                    if pos > p.committed and p.since is None:
                        p.since = now
                if any(
                    p.since is not None
                    and (
                        len(p.records) >= opts.commit_max_records
                        or (now - p.since >= interval and not follower.full)
                        or now - p.since >= 1.0
                    )
                    for p in pending.values()
                ):
                    # every read range joins the one that is due: a producer transaction over several
                    # of the task's partitions arrives within a millisecond, but its first record
                    # (the one poll's wait returned) starts one partition's clock first - alone, that
                    # range took a transaction of its own and the others waited for it
                    due = [k for k, p in pending.items() if p.since is not None]
                    error = self._commit(due, pending, follower.positions)
                    if error is not None:
                        return self._stopped(error, pending)
            # the epoch ends: commit what was read (never leave records a next epoch must re-read)
            due = [k for k, p in pending.items() if p.since is not None]
            if due:
                error = self._commit(due, pending, follower.positions)
                if error is not None:
                    return self._stopped(error, pending)
            return self._report(stopped_by, None, pending)
        except TxnOffsetsError as exc:  # a Kafka read error, an unreachable database: the driver decides
            return self._report("error", exc, pending)
        finally:
            follower.close()

    def _commit(
        self,
        due: list[TopicPartition],
        pending: dict[TopicPartition, _Pending],
        positions: dict[TopicPartition, int],
    ) -> TxnOffsetsError | None:
        """Commit the due partitions' ranges in one transaction; the error if they did not commit."""
        t = self.t
        prepared: list[Prepared[Any]] = []
        for key in due:
            p = pending[key]
            rng = OffsetRange(key[0], key[1], p.committed, positions[key], self.topic_ids.get(key[0]))
            item = prepare_range(rng, iter(p.records), t.prepare, dead_letters=t.dead_letters)
            if isinstance(item, Stop):
                return item.error
            prepared.append(item)
        ranges = [item.range for item in prepared]
        unit = unit_of(t.run, t.database, prepared, t.write, source=t.kafka, batch=t.epoch)
        records = sum(item.records for item in prepared)
        started = time.monotonic()
        reports = commit_reporting(t.database, unit, isolation_level=t.isolation_level, records=records)
        if len(self.commit_ms) < 2000:
            self.commit_ms.append((time.monotonic() - started) * 1000)
        for report in reports:
            if report.error is not None:
                return report.error
        if reports and reports[0].outcome is Outcome.ALREADY_COMMITTED:
            self.already += 1
        else:
            self.commits += 1
        for rng in ranges:
            p = pending[rng.key]
            p.total += len(p.records)
            p.committed, p.records, p.since = rng.until, [], None
        return None

    def _stopped(self, error: TxnOffsetsError, pending: dict[TopicPartition, _Pending]) -> FollowReport:
        if not isinstance(error, OffsetConflict):
            return self._report("error", error, pending)
        # another copy of this task moved the offsets (the run's own generation: nobody else can):
        # this copy stops, and ends the epoch so that the next one is planned from the table
        logger.info(
            "job %r epoch %d task %d: superseded (%s)", self.t.run.job, self.t.epoch, self.index, error
        )
        try:
            end_epoch(self.store, self.t.run)
        except TxnOffsetsError as exc:
            logger.warning("job %r: could not end the epoch (%s)", self.t.run.job, exc)
        return self._report("superseded", None, pending)

    def _report(
        self,
        stopped_by: str,
        error: TxnOffsetsError | None = None,
        pending: dict[TopicPartition, _Pending] | None = None,
    ) -> FollowReport:
        spans = tuple(
            TaskReport(
                OffsetRange(k[0], k[1], p.first_start, p.committed, self.topic_ids.get(k[0])),
                Outcome.COMMITTED,
                p.total,
            )
            for k, p in (pending or {}).items()
            if p.committed > p.first_start
        )
        if error is not None:
            logger.info(
                "job %r epoch %d task %d stopped: %s", self.t.run.job, self.t.epoch, self.index, error
            )
        return FollowReport(
            self.index, spans, self.commits, self.already, stopped_by, error, tuple(self.commit_ms)
        )
