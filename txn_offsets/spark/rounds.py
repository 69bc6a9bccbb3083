"""Shared rounds: the batches of many ``run_job`` loops of one Spark application, ONE Spark job per round.

A Spark job has a fixed cost however small its batch (scheduling, the task closures, a round trip
to the Python workers: ~150-200 ms on a 2-core machine), so 32 small jobs that each run a Spark
job per batch spend most of their time on it. With rounds (:func:`txn_offsets.spark.many.run_jobs`
on a classic session, for jobs with a :class:`~txn_offsets.spark.writers.PartitionWriter`), each
job's thread still plans, commits under its own run and generation and publishes on its own; only
the Spark job is shared. The batches submitted while a round runs, or within a short gathering
window, go into the next round, spread over at most one Spark task per core (``unit`` = one job's
ranges of the round). Every unit is committed by its job's own :class:`PartitionTask`, in its own
transaction(s) with the usual guard (``off = from`` and the job's generation), so a round changes
how many Spark jobs carry the batches, never what is committed.

A job's failure stays its own: an exception in one unit is caught in the task and returned to that
job only (its batch fails as a transient BatchFailed: it plans again from its stored offsets), and
the task goes on with the other units. A Spark task that fails as a whole (a lost worker) is retried
by Spark, its units found ``already_committed`` where they had committed; a round whose Spark job
fails (or outlives the round's deadline, the smallest ``batch_timeout_s`` of the jobs, and is
cancelled) fails every batch in it, transiently: each job plans again, and runs its next batch in
a Spark job of its own (a round of one, on its own thread) before it joins the rounds again. A job
whose tasks fail as a whole every time (a Python worker that exits or crashes in its code) then
fails alone instead of failing every round it shares.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.commit import commit_units
from txn_offsets.spark import frames
from txn_offsets.spark.batch import assign_ranges, batch_deadline
from txn_offsets.spark.heap import freeze_worker_heap
from txn_offsets.spark.session import session_cores
from txn_offsets.spark.tasks import PartitionTask, Staged, TaskReport, counts_of, reports_of
from txn_offsets.store.database import worker_engine

__all__ = ["Rounds", "UnitFailed"]

logger = logging.getLogger(__name__)

#: a round starts when every member has submitted its batch, no batch came for GATHER_QUIET_S, or
#: the first has waited GATHER_MAX_S: the members plan together right after a round (shared plans),
#: so waiting for them keeps every job in every round instead of two cohorts taking turns
GATHER_QUIET_S = 0.05
GATHER_MAX_S = 0.25
#: while some members have not yet submitted a batch (their runs are starting: a connection, the run's
#: start and its first plan each), a round waits for them up to this long after the rounds began, so
#: the first round carries every job instead of the few that started first (which then stay a cohort)
GATHER_START_S = 2.0


class UnitFailed(Exception):
    """One job's unit of a round raised in its Spark task: the exception's type and message (its
    job's batch fails with them, as a transient BatchFailed, and plans again)."""


@dataclass(frozen=True)
class RoundTask:
    """The picklable body of a round's Spark task: each unit with its own job's PartitionTask.

    Every unit is read and prepared first; then the units that may share a transaction (guarded, all
    of a unit's ranges in one) are committed together, one COMMIT per database instead of one per
    job (:func:`txn_offsets.commit.commit_units`): the topic ids of all their ranges proven in one
    request, each job's ranges claimed under its own run. Where that fast path gives way (any unit
    not claimed or written), nothing of it was committed and each unit commits alone, exactly as
    its own batch would."""

    tasks: tuple[PartitionTask[Any], ...]

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        freeze_worker_heap()
        # the whole input first: PySpark reuses only a worker whose input was read to the end
        units = [(int(job), tuple(group)) for part in assigned for job, group in part]
        staged: list[tuple[int, Staged[Any]]] = []
        for job, group in units:
            task = self.tasks[job]
            try:
                if task.joinable(len(group)):
                    staged.append((job, task.stage([task.ranges[i] for i in group])))
                    continue
                reports = list(task(index, [group]))
            except Exception as exc:  # this job's failure, not the round's: the others go on
                yield job, self._failed(job, exc)
                continue
            yield from ((job, report) for report in reports)
        groups: dict[tuple[Any, str], list[tuple[int, Staged[Any]]]] = {}
        for job, st in staged:
            if st.prepared:
                task = self.tasks[job]
                groups.setdefault((task.database, task.isolation_level), []).append((job, st))
            else:  # its first range was rejected or not consumed: nothing to commit
                yield from ((job, report) for report in st.close([]))
        for members in groups.values():
            yield from self._commit(members)

    def _commit(self, members: list[tuple[int, Staged[Any]]]) -> Iterator[tuple[int, Any]]:
        """The members' prepared ranges in one transaction (each job's under its own run, the topics
        of all proven in one request per cluster), or each in its own where that gives way: the
        commit core decides (:func:`txn_offsets.commit.commit_units`)."""
        tasks = [self.tasks[job] for job, _ in members]
        units = [task.unit(st.prepared) for task, (_, st) in zip(tasks, members, strict=True)]
        db, isolation_level = tasks[0].database, tasks[0].isolation_level
        results = commit_units(worker_engine(db), db, units, isolation_level=isolation_level)
        for (job, st), task, result in zip(members, tasks, results, strict=True):
            try:
                ranges = [p.range for p in st.prepared]
                reports = task.settled(reports_of(result, ranges, counts_of(st.prepared)))
            except Exception as exc:  # as its own task's failure would be: this job's batch fails
                yield job, self._failed(job, exc)
                continue
            yield from ((job, report) for report in st.close(reports))

    def _failed(self, job: int, exc: Exception) -> UnitFailed:
        logger.warning("round unit of job %r failed: %s", self.tasks[job].run.job, type(exc).__name__)
        return UnitFailed(f"{type(exc).__name__}: {str(exc)[:1000]}")


@dataclass
class _Submission:
    task: PartitionTask[Any]
    member: int  # the submitting thread
    done: threading.Event = field(default_factory=threading.Event)
    reports: list[TaskReport] = field(default_factory=list)
    error: BaseException | None = None

    def result(self) -> list[TaskReport]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.reports


class Rounds:
    """Gathers the members' batches and runs each gathering as one Spark job on its own thread.

    Members are the threads inside :meth:`member` (``run_jobs`` gives each job's batch step the
    rounds through :class:`~txn_offsets.spark.shared.Shared`); :meth:`submit` blocks its caller
    until its batch's round has run. ``close()`` ends the round thread once nothing is pending."""

    def __init__(self, spark: Any, *, timeout_s: float | None = None) -> None:
        self.spark = spark
        self.timeout_s = timeout_s
        self.count = 0  # rounds run
        self.batches = 0  # batches carried
        self._slots = max(1, session_cores(spark))
        self._cond = threading.Condition()
        self._pending: list[_Submission] = []
        self._members = 0
        self._submitters: set[int] = set()  # the member threads that have submitted a batch
        self._alone: set[int] = set()  # members whose last round failed: their next batch runs alone
        self._born = time.monotonic()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="txn-offsets-rounds", daemon=True)
        self._thread.start()

    def submit(self, task: PartitionTask[Any]) -> list[TaskReport]:
        """Run `task` over all of its ranges in the next round; its reports, or the round's (or this
        unit's) failure raised."""
        sub = _Submission(task, threading.get_ident())
        with self._cond:
            if self._closed:
                raise RuntimeError("txn_offsets rounds are closed: no round will run this batch")
            alone = sub.member in self._alone
            if not alone:
                self._pending.append(sub)
                self._submitters.add(sub.member)
                self._cond.notify_all()
        if alone:  # its last round failed as a whole: a round of one, here, before it shares again
            try:
                self._run([sub])
            except BaseException as exc:
                sub.error = exc
                sub.done.set()
            else:
                with self._cond:
                    self._alone.discard(sub.member)
                    self._cond.notify_all()
        return sub.result()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """The calling thread is a member for the block: each round waits a moment for its batch."""
        self._member(+1)
        try:
            yield
        finally:
            self._member(-1)

    def _member(self, delta: int) -> None:
        with self._cond:
            self._members += delta
            if delta < 0:
                self._alone.discard(threading.get_ident())
            self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                self._gather()
                batch, self._pending = self._pending, []
            try:
                self._run(batch)
            except BaseException as exc:  # never leave a member waiting on a round that will not end
                with self._cond:
                    self._alone.update(sub.member for sub in batch)
                for sub in batch:
                    if not sub.done.is_set():
                        sub.error = exc
                        sub.done.set()

    def _gather(self) -> None:
        """Wait (lock held, released while waiting) for the other members' batches of this round."""
        first = last = time.monotonic()
        seen = len(self._pending)
        while len(self._pending) < self._members - len(self._alone) and not self._closed:
            now = time.monotonic()
            until = min(last + GATHER_QUIET_S, first + GATHER_MAX_S)
            if len(self._submitters) < self._members:  # runs still starting: their first batch comes
                until = max(until, self._born + GATHER_START_S)
            if now >= until:
                return
            self._cond.wait(until - now)
            if len(self._pending) != seen:
                seen, last = len(self._pending), time.monotonic()

    def _run(self, batch: list[_Submission]) -> None:
        with self._cond:  # the round thread's rounds, and a member's round of one on its own thread
            self.count += 1
            self.batches += len(batch)
            group = f"txn-offsets-round-{self.count}"
        units: list[tuple[int, tuple[int, ...]]] = []
        for i, sub in enumerate(batch):
            ranges = sub.task.ranges
            # enough jobs to fill the slots: one unit per job; else each job's ranges over the
            # slots, as its own batch would spread them (at most its read.max_tasks)
            split = (
                1 if len(batch) >= self._slots else min(self._slots, sub.task.read.max_tasks or self._slots)
            )
            units.extend(
                (i, g) for g in assign_ranges([r.span for r in ranges], max(1, min(len(ranges), split)))
            )
        spans = [sum(batch[i].task.ranges[j].span for j in group) for i, group in units]
        parts = [[units[u] for u in slot] for slot in assign_ranges(spans, min(self._slots, len(units)))]
        body = RoundTask(tuple(sub.task for sub in batch))
        with batch_deadline(self.spark, group, self.timeout_s), frames.worker_imports():
            rdd = self.spark.sparkContext.parallelize(parts, len(parts))
            out = rdd.mapPartitionsWithIndex(body).collect()  # failing: every batch in it fails
        for i, item in out:
            sub = batch[i]
            if isinstance(item, UnitFailed):
                sub.error = item
            else:
                sub.reports.append(item)
        for sub in batch:
            sub.done.set()
