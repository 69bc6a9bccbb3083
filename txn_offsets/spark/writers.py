"""The two ways a batch commits: per partition (in the tasks) or per batch (on the driver).

* :class:`PartitionWriter` - each Spark task reads its range, reduces it (decode, then the user's
  partial aggregate), and commits the range with its result in one transaction. Use it when a
  range's results can be applied on their own (counts, sums, upserts that add).
* :class:`BatchWriter` - for results that need a shuffle: Spark computes over the whole batch, the
  driver collects the result and commits every range of the batch with it in one transaction.

Both run on either execution path of the batch (:mod:`txn_offsets.spark.batch`): the same task body
(:class:`PartitionTask`) runs in an RDD partition or in a ``mapInArrow`` partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import sqlalchemy as sa

from txn_offsets.commit import Unit
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark import frames
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.records import decoded
from txn_offsets.spark.reports import Reporting, unpacked
from txn_offsets.spark.tasks import PartitionTask, TaskReport, commit_reporting
from txn_offsets.store.dead_letters import DeadLetter
from txn_offsets.store.lineage import Lineage

__all__ = ["BatchWriter", "ComputesFirst", "PartitionWriter", "Writer"]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


class Writer(Protocol):
    def commit(self, batch: Batch) -> list[TaskReport]: ...


@runtime_checkable
class ComputesFirst(Protocol):
    """A writer whose batch is a Spark job first and a commit on the driver after it
    (:class:`BatchWriter`): ``commit(batch)`` is ``commit_computed(batch, compute_batch(batch))``,
    so the run loop can compute the next batch while this one commits
    (:mod:`txn_offsets.spark.read_ahead`)."""

    def compute_batch(self, batch: Batch) -> Any: ...

    def commit_computed(self, batch: Batch, result: Any) -> list[TaskReport]: ...


@dataclass(frozen=True)
class PartitionWriter(Generic[T, A]):
    """Commit each range in its own task: ``write(conn, range, aggregate(decode(records)))``.

    Or ``write_all(conn, [(range, aggregate(...)), ...])``: called once per transaction with every
    range it commits (a task's ranges, ``ReadOptions.ranges_per_transaction`` at a time), so the
    results of many small ranges go to the database in one statement (merge them first: ranges of
    one topic can share a key). Give exactly one of ``write`` and ``write_all``.

    ``decode`` (default: the Record itself) turns a record into the user's value; a failure rejects
    the batch with the record's topic/partition/offset. ``aggregate`` (default: ``list``) reduces a
    range's values to what ``write`` needs, before the transaction opens; it must read its input
    to the end (a range with unread records is refused with RecordsNotConsumed, never committed),
    and an iterator it returns (a generator, ``map(...)``) is materialised before ``write``. With
    ``dead_letters=True`` a record the decoder rejects is not fatal: it goes to the schema's
    ``dead_letters`` table in the same transaction as the range's results and offset.

    ``write`` / ``write_all`` may run more than once for the same aggregates: after PostgreSQL
    rolled the transaction back (a deadlock, a serialization failure: retried, nothing committed)
    and when a shared round's shared transaction gives way to a transaction per job. They must
    not change the aggregates they are given (merge into a new dict, never into one of them): a
    second run would write what the first one changed.
    """

    write: Callable[[sa.Connection, OffsetRange, A], None] | None = None
    decode: Callable[[Record], T] | None = None
    aggregate: Callable[[Iterator[T]], A] | None = None
    isolation_level: str = "READ COMMITTED"
    after_commit: Callable[[OffsetRange, str], None] | None = None
    dead_letters: bool = False
    write_all: Callable[[sa.Connection, Sequence[tuple[OffsetRange, A]]], None] | None = None

    def __post_init__(self) -> None:
        if (self.write is None) == (self.write_all is None):
            raise ConfigError(
                "write",
                "give exactly one of write(conn, range, result) (per range) or write_all(conn, "
                "[(range, result), ...]) (every range of a transaction at once)",
            )

    def write_ranges(self, conn: sa.Connection, items: Sequence[tuple[OffsetRange, A]]) -> None:
        """Write the prepared results of the ranges one transaction commits: ``write_all`` once,
        or ``write`` per range."""
        if self.write_all is not None:
            self.write_all(conn, items)
        elif self.write is not None:  # one of the two: checked on construction
            for rng, value in items:
                self.write(conn, rng, value)

    def prepare(self, records: Iterator[Record], dead: list[DeadLetter] | None = None) -> A:
        values: Iterator[Any] = decoded(records, self.decode, dead) if self.decode is not None else records
        if self.aggregate is None:
            everything: Any = list(values)
            return everything  # type: ignore[no-any-return]
        result: Any = self.aggregate(values)
        if isinstance(result, Iterator):
            # a generator or map()/filter(): lazy over the records, which are about to be checked
            # for leftovers. Materialise it now, while it can still read them.
            result = list(result)
        return result  # type: ignore[no-any-return]

    def commit(self, batch: Batch) -> list[TaskReport]:
        task = PartitionTask(
            database=batch.database,
            kafka=batch.kafka,
            run=batch.run,
            ranges=batch.ranges,
            prepare=self.prepare,
            write=self.write_ranges,
            read=batch.read,
            isolation_level=self.isolation_level,
            after_commit=self.after_commit,
            dead_letters=self.dead_letters,
            batch=batch.number,
        )
        if batch.path == "dataframe":
            return frames.run_tasks(batch.spark, batch.groups(), task)
        if batch.shared_round is not None:  # run_jobs: this batch's Spark job is shared with the other jobs'
            return batch.shared_round(task)
        with frames.worker_imports():
            packed = batch.ranges_rdd().mapPartitionsWithIndex(Reporting(task)).collect()
        return unpacked(task.ranges, packed)


@dataclass(frozen=True, kw_only=True)
class BatchWriter(Generic[R]):
    """Commit the whole batch from the driver: ``write(conn, ranges, compute(...))``.

    Give exactly one of:

    * ``compute_df(records)`` - runs any Spark job over the batch's **DataFrame** of records
      (``key, value, topic, partition, offset, timestamp, headers``; shuffles allowed). Works on
      every session, classic or Spark Connect, and on both execution paths.
    * ``compute(records)`` - the same over the batch's **RDD[Record]**: classic Spark only, on the
      RDD execution path (under Spark Connect it is refused with a ConfigError naming compute_df).

    Either returns a driver-side result (e.g. a collected list of rows). Nothing is claimed until
    it has finished. A batch's ``records`` (``on_batch``, the job's summary) are the offsets its
    ranges committed: compute saw the batch whole, and counting its records would cost a Spark job.

    While a job catches up, ``run_job`` computes the next batch while the driver commits this one
    (:mod:`txn_offsets.spark.read_ahead`), in a thread of its own: ``compute`` may run while
    ``write`` runs (never two computes at once), and a computed batch is dropped, never written,
    when the batch before it does not commit.
    """

    write: Callable[[sa.Connection, Sequence[OffsetRange], R], None]
    compute: Callable[[Any], R] | None = None
    compute_df: Callable[[Any], R] | None = None
    isolation_level: str = "READ COMMITTED"

    def __post_init__(self) -> None:
        if (self.compute is None) == (self.compute_df is None):
            raise ConfigError(
                "compute",
                "give exactly one of compute_df (over a DataFrame of records: any session) or "
                "compute (over an RDD[Record]: classic Spark only)",
            )

    def commit(self, batch: Batch) -> list[TaskReport]:
        return self.commit_computed(batch, self.compute_batch(batch))

    def commit_computed(self, batch: Batch, result: R) -> list[TaskReport]:
        """Commit every range of `batch` with `result` (what :meth:`compute_batch` returned for it)
        in one transaction on the driver."""
        unit = Unit(
            batch.run,
            list(batch.ranges),
            lambda conn: self.write(conn, batch.ranges, result),
            Lineage(batch.number),  # record timestamps unknown: compute() saw the batch whole
            source=batch.kafka,  # compute() has read every record: prove the topics are the planned ones
        )
        # compute() saw the batch whole, so no range has a count of its own: each reports the
        # offsets it committed (records, and in a transactional topic its markers and aborted records)
        spans = {r.key: r.span for r in batch.ranges}
        return commit_reporting(batch.database, unit, isolation_level=self.isolation_level, records=spans)

    def compute_batch(self, batch: Batch) -> R:
        """The user's compute over the batch's records (a Spark job; nothing claimed)."""
        if self.compute_df is not None:
            with frames.worker_imports():
                return self.compute_df(batch.records_frame())
        if self.compute is None or batch.path != "rdd":  # (compute is set: checked on construction)
            raise ConfigError(
                "compute",
                "BatchWriter(compute=...) computes over an RDD, and this batch runs on the DataFrame "
                "path (Spark Connect has no RDD API): give BatchWriter(compute_df=...) a function "
                "over the batch's DataFrame of records instead",
            )
        with frames.worker_imports():
            return self.compute(batch.records())
