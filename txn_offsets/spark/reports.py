"""A task's reports on their way back to the driver: one tuple of plain values per Spark task.

A batch's task reports (:class:`~txn_offsets.spark.tasks.TaskReport`, one per range) cross from
the Python workers to the driver every batch. Pickled one by one they cost a Python call per object
on both sides (Spark pickles task output with cloudpickle, whose hook runs for every object that is
not a plain value): at 4,096 partitions 17.5 ms a task of 2,048 reports to pickle and 10 ms each
to unpickle on the driver, on a busy 2-core machine. The driver already holds the batch's ranges,
so a task sends each report as its range's index in the task body's ranges, its outcome and its
record count, in three tuples of plain values (pickled by C code alone); a report that does not fit
that shape (one with an error, or a range other than the planned one) travels whole. The driver
rebuilds the same reports, in the same order, from its own ranges (:func:`unpacked`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from txn_offsets.commit import Outcome
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import PartitionTask, TaskReport, range_indexes

__all__ = ["Packed", "Reporting", "packed", "unpacked"]

A = TypeVar("A")

#: one task's reports, in order: each one's range index (-1: sent whole), outcome value and record
#: count; and the reports sent whole, in order
Packed = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], tuple[TaskReport, ...]]

_OUTCOMES = {o.value: o for o in Outcome}


@dataclass(frozen=True)
class Reporting(Generic[A]):
    """A PartitionTask's body for Spark: its reports as one :data:`Packed` per Spark task."""

    task: PartitionTask[A]

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[Packed]:
        groups = list(assigned)  # the whole input first (PySpark reuses a worker that read it all)
        ranges = self.task.ranges
        indexes = {ranges[i].key: i for i in range_indexes(groups)}
        yield packed(ranges, indexes, self.task(index, groups))


def packed(ranges: Sequence[OffsetRange], indexes: dict[Any, int], reports: Iterable[TaskReport]) -> Packed:
    """`reports` of ranges of `ranges` (`indexes`: range key -> its index there) as plain values."""
    where: list[int] = []
    outcomes: list[str] = []
    records: list[int] = []
    whole: list[TaskReport] = []
    for report in reports:
        rng = report.range
        i = indexes.get(rng.key, -1)
        planned = ranges[i] if i >= 0 else None
        if report.error is not None or (rng is not planned and not _same(rng, planned)):
            where.append(-1)
            outcomes.append("")
            records.append(0)
            whole.append(report)
            continue
        where.append(i)
        outcomes.append(report.outcome.value)
        records.append(report.records)
    return tuple(where), tuple(outcomes), tuple(records), tuple(whole)


def _same(rng: OffsetRange, planned: OffsetRange | None) -> bool:
    return planned is not None and rng == planned and rng.topic_id == planned.topic_id


def unpacked(ranges: Sequence[OffsetRange], tasks: Iterable[Packed]) -> list[TaskReport]:
    """The reports of every task, in task order, each as its task built it."""
    reports: list[TaskReport] = []
    for where, outcomes, records, whole in tasks:
        sent = iter(whole)
        for i, outcome, n in zip(where, outcomes, records, strict=True):
            reports.append(TaskReport(ranges[i], _OUTCOMES[outcome], n) if i >= 0 else next(sent))
    return reports
