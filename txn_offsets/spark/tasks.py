"""What runs inside a Spark task: read each of its ranges, decode, aggregate, and commit its ranges
with their results, all in one transaction (or ``ReadOptions.ranges_per_transaction`` at a time).

A task's input is the list of its range indexes (on the RDD path and the DataFrame path alike), so
a task always knows its ranges, however many it was given. Records are read and reduced *before*
the transaction opens, so the transaction only holds the claimed offset rows for as long as the
writes take. The SQLAlchemy engine is created once per Python worker (Spark reuses workers) and
keyed by the database settings (:func:`txn_offsets.store.database.worker_engine`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from txn_offsets.commit import Outcome, RangeOutcome, Unit, commit_unit
from txn_offsets.commit.staging import Prepare, Prepared, RangesWrite, Stop, prepare_range, unit_of
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, TxnOffsetsError
from txn_offsets.kafka.reader import read_in_order
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange, PackedRanges, TopicPartition, packed_ranges
from txn_offsets.spark.heap import freeze_worker_heap
from txn_offsets.store.database import worker_engine
from txn_offsets.store.runs import Run
from txn_offsets.upserts import merging_upserts

logger = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True)
class ReadOptions:
    """How tasks read and commit: records per consume() call, the stall bound, how many Spark tasks
    a batch's ranges are spread over (None: one per core of the session, ``defaultParallelism``),
    and how many of a task's ranges one transaction commits.

    Fewer tasks than ranges is cheaper: each Spark task costs tens of milliseconds however small
    its range. ``ranges_per_transaction=None`` (the default) commits all of a task's ranges in one
    transaction: one claim statement, the write of each range, one COMMIT - a task first reads and
    prepares every range it commits together, so their prepared results are held in memory at once.
    ``1`` commits each range on its own as soon as it is prepared (the choice when one range's
    prepared result is large); ``N`` commits N ranges at a time."""

    batch_size: int = 2000
    stall_timeout_s: float = 60.0
    max_tasks: int | None = None
    ranges_per_transaction: int | None = None

    def __post_init__(self) -> None:
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ConfigError("max_tasks", f"must be >= 1 or None, got {self.max_tasks}")
        n = self.ranges_per_transaction
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(
                "ranges_per_transaction",
                f"must be an int >= 1, or None for all of a task's ranges in one transaction; got {n!r}",
            )


@dataclass(frozen=True, slots=True)
class TaskReport:
    """What a task tells the driver about its range (pickled back by collect()): a success
    outcome, or (with `error`) the outcome under which the error is reported.

    A batch's reports (one per range: 4,096 at 4,096 partitions) are pickled by the Python workers
    and unpickled by the driver every batch, and the job's summary keeps the last 10,000: slots,
    pickled as its values (two objects a report instead of four: less to pickle and unpickle than
    the default, and fewer objects for the driver's garbage collector to traverse)."""

    range: OffsetRange
    outcome: Outcome
    records: int
    error: TxnOffsetsError | None = None

    def __post_init__(self) -> None:
        # a report built with the outcome's name ("committed") is the same report: counted alike
        if not isinstance(self.outcome, Outcome):
            object.__setattr__(self, "outcome", Outcome(self.outcome))

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskReport, (self.range, self.outcome, self.records, self.error))


def success_counts(reports: Iterable[TaskReport]) -> dict[str, int]:
    """Ranges per success outcome (``committed``, ``already_committed``): a batch's statistics.
    Counted by C code (an outcome's ``value`` and ``success`` are Python lookups: 12 ms for a batch
    of 4,096 reports on a busy driver, twice a batch)."""
    every = collections.Counter(report.outcome for report in reports)
    return {o.value: every[o] for o in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED)}


#: a report's record count: one for every range, or each range's by its key
Counts = int | Mapping[TopicPartition, int]


def commit_reporting(
    db: DatabaseSettings, unit: Unit, *, isolation_level: str, records: Counts
) -> list[TaskReport]:
    """The commit core's commit of `unit` on this worker's engine, with a conflict or a fencing
    turned into reports: nothing was written, and the driver raises the error with its context (a
    Spark retry of the task could never succeed). Call it once the unit's records were read: COMMIT
    waits for the proof that each topic is still the incarnation the ranges were planned from."""
    try:
        outcomes = commit_unit(worker_engine(db), db, unit, isolation_level=isolation_level)
    except TxnOffsetsError as exc:
        return reports_of(exc, unit.ranges, records)
    return reports_of(outcomes, unit.ranges, records)


def reports_of(
    result: Sequence[RangeOutcome] | Exception, ranges: Sequence[OffsetRange], records: Counts = 0
) -> list[TaskReport]:
    """A commit's result as its ranges' reports: each range's outcome, or an error with an outcome
    on every range. An error without one is raised. An error with an outcome is reported, not
    raised: Spark's own task retry could not change it (or, for ClaimBlocked, should not wait again
    in place); the driver raises it with its context, and the runner plans again from the stored
    offsets when it is Transient. `records`: the count each report carries (by range key: built
    once with it, where a task used to build its reports again with their counts)."""
    count = records.__getitem__ if isinstance(records, Mapping) else lambda _key: records
    if isinstance(result, Exception):
        if not isinstance(result, TxnOffsetsError) or result.outcome is None:
            raise result
        return [TaskReport(r, Outcome(result.outcome), count(r.key), result) for r in ranges]
    return [TaskReport(o.range, o.outcome, count(o.range.key)) for o in result]


def counts_of(prepared: Iterable[Prepared[Any]]) -> dict[TopicPartition, int]:
    """The record count of each prepared range, by key (what its report carries)."""
    return {p.range.key: p.records for p in prepared}


def stop_report(stop: Stop) -> TaskReport:
    """The report of a range that stopped its group (a rejected record, records not consumed)."""
    return TaskReport(stop.range, Outcome(stop.error.outcome), stop.records, stop.error)


@dataclass(frozen=True)
class PartitionTask(Generic[A]):
    """The picklable body of a per-partition commit task."""

    database: DatabaseSettings
    kafka: KafkaSettings
    run: Run
    ranges: Sequence[OffsetRange]  # where unpickled: PackedRanges (each range built once looked up)
    prepare: Prepare[A]
    write: RangesWrite[A]  # the ranges of a transaction
    read: ReadOptions = field(default_factory=ReadOptions)
    isolation_level: str = "READ COMMITTED"
    after_commit: Callable[[OffsetRange, str], None] | None = None
    dead_letters: bool = False
    batch: int | None = None  # the runner's batch number, for the lineage rows

    def __reduce__(self) -> tuple[Any, ...]:
        return _with_packed_ranges(self)

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[TaskReport]:
        """Read and commit the ranges this task was given, ``read.ranges_per_transaction`` at a time
        (None: all in one transaction). After a range that failed (a conflict, fencing, a rejected
        record) the rest are left alone: the driver raises that error and plans again from the
        stored offsets."""
        freeze_worker_heap()
        ranges = [self.ranges[i] for i in range_indexes(assigned)]
        size = self.read.ranges_per_transaction or max(1, len(ranges))
        for first in range(0, len(ranges), size):
            reports = self._commit_group(ranges[first : first + size])
            yield from reports
            if any(r.error is not None for r in reports):
                return

    def _commit_group(self, group: list[OffsetRange]) -> list[TaskReport]:
        """Read and prepare each range of `group`, then commit them in one transaction. A range whose
        records were rejected or not consumed stops the group: the ranges prepared before it are
        committed (as they were when each range had its own transaction), then its report follows."""
        staged = self.stage(group)
        return staged.close(self.commit(staged.prepared) if staged.prepared else [])

    def joinable(self, ranges: int) -> bool:
        """Whether this task's `ranges` ranges may be committed in a transaction shared with other
        runs' units (:func:`txn_offsets.commit.commit_units`): all of them in one transaction."""
        return (self.read.ranges_per_transaction or ranges) >= ranges

    def stage(self, group: list[OffsetRange]) -> Staged[A]:
        """Read and prepare the ranges of `group` up to the first one rejected or not consumed."""
        prepared: list[Prepared[A]] = []
        opts = self.read
        reading = read_in_order(
            self.kafka, group, batch_size=opts.batch_size, stall_timeout_s=opts.stall_timeout_s
        )
        for rng, records in reading:
            item = prepare_range(rng, records, self.prepare, dead_letters=self.dead_letters)
            if isinstance(item, Stop):
                return Staged(prepared, stop_report(item))
            prepared.append(item)
        return Staged(prepared, None)

    def unit(self, prepared: Sequence[Prepared[A]]) -> Unit:
        """What one transaction commits for the `prepared` ranges (proven against this task's Kafka).
        The write runs inside :func:`~txn_offsets.upserts.merging_upserts`: a per-range ``write``'s
        ``upsert_add`` calls go as one statement per transaction, not one per range."""
        write = _MergingWrite(self.write)
        return unit_of(self.run, self.database, prepared, write, source=self.kafka, batch=self.batch)

    def commit(self, prepared: list[Prepared[A]]) -> list[TaskReport]:
        """Commit the `prepared` ranges in one transaction of their own."""
        reports = commit_reporting(
            self.database,
            self.unit(prepared),
            isolation_level=self.isolation_level,
            records=counts_of(prepared),
        )
        return self.settled(reports)

    def settled(self, reports: list[TaskReport]) -> list[TaskReport]:
        """The reports of committed ranges (with their record counts: :func:`counts_of`), after the
        after_commit hook ran for each (unless a range failed)."""
        if any(r.error is not None for r in reports):
            return reports  # conflict / fenced / ...: not retried into success, the driver raises it
        if self.after_commit is not None:
            for r in reports:
                # runs after COMMIT, before the task reports: an exception here makes Spark retry a
                # task whose ranges are already committed (fault injection, notifications)
                self.after_commit(r.range, r.outcome)
        return reports


@dataclass(frozen=True)
class Staged(Generic[A]):
    """A group's ranges read and prepared, up to `stop`: the report of the range that ended it
    (rejected or not consumed), committed after the ones before it."""

    prepared: list[Prepared[A]]
    stop: TaskReport | None

    def close(self, reports: list[TaskReport]) -> list[TaskReport]:
        """The group's reports: the prepared ranges', then the stop's unless one of them failed."""
        if self.stop is None or any(r.error is not None for r in reports):
            return reports
        return [*reports, self.stop]


@dataclass(frozen=True)
class _MergingWrite(Generic[A]):
    """A transaction's write with its consecutive upserts of one table merged (merging_upserts)."""

    write: RangesWrite[A]

    def __call__(self, conn: sa.Connection, items: Sequence[tuple[OffsetRange, A]]) -> None:
        with merging_upserts(conn):
            self.write(conn, items)


def _with_packed_ranges(task: Any) -> tuple[Any, ...]:
    """How a task body with a batch's ranges pickles (``__reduce__``): its fields, the ranges as
    plain tuples (:func:`~txn_offsets.ranges.packed_ranges`: a batch of 4,096 ranges pickled in
    ~1 ms instead of ~18), where it is unpickled each rebuilt and checked as the task looks it up
    (:class:`~txn_offsets.ranges.PackedRanges`: a task builds its own group's only)."""
    fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    fields["ranges"] = packed_ranges(task.ranges)
    return (_task_with_ranges, (type(task), fields))


def _task_with_ranges(kind: Callable[..., Any], fields: dict[str, Any]) -> Any:
    return kind(**(fields | {"ranges": PackedRanges(fields["ranges"])}))


def range_indexes(assigned: Iterable[Any]) -> list[int]:
    """The indexes of the ranges a task was given (its input: one tuple of indexes), read to the
    end first: PySpark only reuses a Python worker whose input stream was consumed completely."""
    return [int(i) for group in assigned for i in group]


@dataclass(frozen=True)
class ReadTask:
    """The picklable body of a batch's records (RDD or DataFrame path): a task yields the records
    of each range it was given, range after range, each in offset order."""

    kafka: KafkaSettings
    ranges: Sequence[OffsetRange]  # where unpickled: PackedRanges
    read: ReadOptions = field(default_factory=ReadOptions)

    def __reduce__(self) -> tuple[Any, ...]:
        return _with_packed_ranges(self)

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[Record]:
        freeze_worker_heap()
        ranges = [self.ranges[i] for i in range_indexes(assigned)]
        opts = self.read
        for _rng, records in read_in_order(
            self.kafka, ranges, batch_size=opts.batch_size, stall_timeout_s=opts.stall_timeout_s
        ):
            yield from records
