"""The exactly-once sink of a ``txn_offsets`` stream: a ``foreachBatch`` function.

For each micro-batch it loads the ranges the source planned (``stream_plans``), computes the batch's
result with the user's ``compute_df`` over the batch DataFrame, and commits the ranges with
``write(conn, ranges, result)`` in ONE PostgreSQL transaction guarded like every claim (``off =
start`` and the run's generation). So:

* a batch whose ranges are already committed (a replay) writes nothing: ``write`` is not called;
* a batch without ranges (Spark runs batch 0 of a query even when there is nothing to read) is
  a no-op;
* a conflict that is not a replay (another writer moved an offset) fails the query, as does a
  newer run (Fenced): nothing of the batch is written;
* a batch whose topic was deleted and re-created after its plan (TopicChanged: its records came
  from the new topic) writes nothing and is let go: the next plan starts from the offsets table
  and reports the re-creation as data loss (``on_data_loss``: the query fails, or skips audited);
* the lease is renewed while the batch runs, like ``run_job`` does, until ``batch_timeout_s``:
  then the batch's Spark jobs are cancelled and the query fails with BatchFailed.

It runs where Spark runs ``foreachBatch`` functions: in the client's Python process on classic
Spark, in a Python worker of the Connect server under Spark Connect (so it is picklable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from txn_offsets.commit import Outcome, Unit
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.batch import batch_deadline
from txn_offsets.spark.frames import worker_imports
from txn_offsets.spark.tasks import commit_reporting, success_counts
from txn_offsets.store.database import worker_engine
from txn_offsets.store.handle import Store
from txn_offsets.store.lease import keep_lease
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run
from txn_offsets.store.stats import FAILURES, record_batch, record_failure
from txn_offsets.store.stream_plans import let_go, load_plan, mark_committed

__all__ = ["ExactlyOnceSink"]

logger = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class ExactlyOnceSink(Generic[R]):
    """``foreachBatch(sink)``: ``write(conn, ranges, compute_df(batch_df))`` committed with the ranges."""

    run: Run
    database: DatabaseSettings
    write: Callable[[sa.Connection, Sequence[OffsetRange], R], None]
    compute_df: Callable[[Any], R] | None = None
    # where the batch's records were read: after compute_df, the topics must still be the
    # incarnations the ranges were planned from (TopicChanged fails the batch, nothing committed)
    kafka: KafkaSettings
    isolation_level: str = "READ COMMITTED"
    lease_s: float = 60.0
    batch_timeout_s: float | None = 600.0

    def __call__(self, batch: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        store = Store(
            worker_engine(self.database), self.database
        )  # in this process only: an engine is not picklable
        ranges = load_plan(store, self.run).ranges
        if not ranges:
            return  # nothing was planned: Spark's first batch of a query with nothing to read
        every_s = max(1.0, self.lease_s / 3)
        with keep_lease(store, self.run, every_s=every_s, for_s=self.batch_timeout_s):
            result = self._compute(batch, batch_id)

            def write(conn: sa.Connection) -> None:
                self.write(conn, ranges, result)
                mark_committed(conn, self.database, self.run, ranges)

            # Spark's batch id of the query in the lineage; no record timestamps
            unit = Unit(self.run, list(ranges), write, Lineage(batch_id), source=self.kafka)
            reports = commit_reporting(self.database, unit, isolation_level=self.isolation_level, records=-1)
        if any(report.outcome is Outcome.TOPIC_CHANGED for report in reports):
            let_go(store, self.run, ranges)
            changed = next(r.error for r in reports if r.outcome is Outcome.TOPIC_CHANGED)
            logger.warning(
                "job=%r stream batch=%d not committed, planned again: %s", self.run.job, batch_id, changed
            )
            return
        for report in reports:
            if report.error is not None:
                if report.outcome in FAILURES:  # counted in job_stats under the same name
                    record_failure(store, self.run.job, report.outcome)
                raise report.error
        outcomes = success_counts(reports)
        seconds = time.monotonic() - t0
        record_batch(store, self.run.job, seconds, outcomes)
        logger.info(
            "job=%r stream batch=%d ranges=%d committed=%d already_committed=%d seconds=%.2f",
            self.run.job,
            batch_id,
            len(ranges),
            outcomes["committed"],
            outcomes["already_committed"],
            seconds,
        )

    def _compute(self, batch: Any, batch_id: int) -> Any:
        tag = f"txn-offsets-stream-{self.run.run_id}-{batch_id}".replace(":", "-")
        expired: threading.Event | None = None
        try:
            with batch_deadline(batch.sparkSession, tag, self.batch_timeout_s) as expired, worker_imports():
                return self.compute_df(batch) if self.compute_df is not None else batch.collect()
        except Exception:
            if expired is not None and expired.is_set():
                detail = (
                    f"still running after batch_timeout_s={self.batch_timeout_s:g}s; its Spark jobs "
                    f"were cancelled"
                )
                raise BatchFailed(self.run.job, batch_id, detail) from None
            raise
