"""The two ways a batch commits: per partition (in the tasks) or per batch (on the driver).

* :class:`PartitionWriter` - each Spark task reads its range, reduces it (decode, then the user's
  partial aggregate), and commits the range with its result in one transaction. Use it when a
  range's results can be applied on their own (counts, sums, upserts that add).
* :class:`BatchWriter` - for results that need a shuffle: Spark computes over the whole batch, the
  driver collects the result and commits every range of the batch with it in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa

from txn_offsets.kafka.reader import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.executor import DeadLetter, PartitionTask, TaskReport, commit_reporting, decoded

__all__ = ["BatchWriter", "PartitionWriter", "Writer"]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


class Writer(Protocol):
    def commit(self, batch: Batch) -> list[TaskReport]: ...


@dataclass(frozen=True)
class PartitionWriter(Generic[T, A]):
    """Commit each range in its own task: ``write(conn, range, aggregate(decode(records)))``.

    ``decode`` (default: the Record itself) turns a record into the user's value; a failure rejects
    the batch with the record's topic/partition/offset. ``aggregate`` (default: ``list``) reduces a
    range's values to what ``write`` needs, before the transaction opens; it must read its input
    to the end (a range with unread records is refused with RecordsNotConsumed, never committed),
    and an iterator it returns (a generator, ``map(...)``) is materialised before ``write``. With
    ``dead_letters=True`` a record the decoder rejects is not fatal: it goes to the schema's
    ``dead_letters`` table in the same transaction as the range's results and offset.
    """

    write: Callable[[sa.Connection, OffsetRange, A], None]
    decode: Callable[[Record], T] | None = None
    aggregate: Callable[[Iterator[T]], A] | None = None
    isolation_level: str = "READ COMMITTED"
    after_commit: Callable[[OffsetRange, str], None] | None = None
    dead_letters: bool = False

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
            write=self.write,
            read=batch.read,
            isolation_level=self.isolation_level,
            after_commit=self.after_commit,
            dead_letters=self.dead_letters,
        )
        reports: list[TaskReport] = batch.ranges_rdd().mapPartitionsWithIndex(task).collect()
        return reports


@dataclass(frozen=True)
class BatchWriter(Generic[R]):
    """Commit the whole batch from the driver: ``write(conn, ranges, compute(records_rdd))``.

    ``compute`` runs any Spark job over the batch's RDD[Record] (shuffles allowed) and returns a
    driver-side result (e.g. a collected list of rows). Nothing is claimed until it has finished.
    """

    compute: Callable[[Any], R]
    write: Callable[[sa.Connection, Sequence[OffsetRange], R], None]
    isolation_level: str = "READ COMMITTED"

    def commit(self, batch: Batch) -> list[TaskReport]:
        result = self.compute(batch.records())
        return commit_reporting(
            batch.database,
            batch.run,
            list(batch.ranges),
            lambda conn: self.write(conn, batch.ranges, result),
            isolation_level=self.isolation_level,
            records=-1,  # unknown per range: compute() saw the batch as a whole
        )
