"""The at-least-once contender's commit: the same tasks and writes as txn_offsets, without the guard.

``alo`` in make bench is txn_offsets minus the guard, to measure what the guard costs: the same
reads, the same user write in the same kind of transaction, but no claim, no lineage, no proof, and
offsets kept in the driver's memory only. That transaction is written here, in benchmarks/, not in
the product: txn_offsets itself commits only through its commit core (``txn_offsets.commit``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from txn_offsets.commit import Outcome, RangeOutcome, Unit
from txn_offsets.commit.staging import Prepared
from txn_offsets.spark.stream.realtime_sink import RealTimeSink
from txn_offsets.spark.tasks import PartitionTask, TaskReport, counts_of, reports_of
from txn_offsets.store.database import worker_engine

__all__ = ["UnguardedRealTimeSink", "UnguardedTask", "write_unguarded"]


def write_unguarded(engine: sa.Engine, unit: Unit, isolation_level: str) -> list[RangeOutcome]:
    """BEGIN, the unit's write, COMMIT: what an at-least-once sink does (nothing claimed or recorded)."""
    with engine.connect() as plain:
        conn = plain.execution_options(isolation_level=isolation_level)
        with conn.begin():
            if unit.write is not None:
                unit.write(conn)
    return [RangeOutcome(r, Outcome.COMMITTED) for r in unit.ranges]


class UnguardedTask(PartitionTask[Any]):
    """PartitionTask whose transactions write without the claim (at-least-once)."""

    def commit(self, prepared: list[Prepared[Any]]) -> list[TaskReport]:
        unit = self.unit(prepared)
        outcomes = write_unguarded(worker_engine(self.database), unit, self.isolation_level)
        return self.settled(reports_of(outcomes, unit.ranges, counts_of(prepared)))

    def joinable(self, ranges: int) -> bool:
        return False  # never into a joint transaction of the commit core


class UnguardedRealTimeSink(RealTimeSink):
    """RealTimeSink whose groups are written without the claim (at-least-once)."""

    def commit(self, engine: sa.Engine, unit: Unit) -> list[RangeOutcome]:
        return write_unguarded(engine, unit, self.isolation_level)
