"""The database half of a run's next plan, read while its current batch runs.

A plan is a Kafka request (the topics' ids and watermarks) and a transaction that renews the run's
lease and reads the job's offset rows (:func:`~txn_offsets.planner.plan_batch`): ~10 ms of a small
batch's ~130 on a 2-core machine, spent while Spark's slots wait. :class:`PlanAhead` reads the rows
in that transaction while the batch's Spark job runs, on a thread of its own; once the batch is
back and EVERY range of it committed, the next plan is those rows with the batch's partitions at
their ranges' ends, against watermarks asked of Kafka then (fresh: a batch planned ahead reads
every record that arrived while the last one ran, as one planned after it would)
(:func:`~txn_offsets.planner.plan_settled`).

Nothing here moves an offset. Where the plan would move one (a partition to seed, a topic id to
adopt, data lost), where a row of the batch is at neither end of its range, where a range did not
commit, or where the rows could not be read, there is no plan ahead: the run plans as always.
The rows of the other partitions cannot change under the run without a newer generation (a new
run, a reset, an import), which the next claims' guard (``off = from`` and the generation) refuses
as Fenced whatever the plan said.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka import metadata
from txn_offsets.planner import Limits, Plan, TopicSelection, plan_settled
from txn_offsets.ranges import OffsetRange, TopicPartition
from txn_offsets.store import lineage, offset_rows
from txn_offsets.store.database import translate_errors
from txn_offsets.store.offset_rows import StoredOffset
from txn_offsets.store.runs import Run, renew_lease

__all__ = ["PlanAhead"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Read:
    rows: Mapping[TopicPartition, StoredOffset]
    first_plan: bool


class PlanAhead:
    """One run's next plan, half made while its batch runs (see the module's docstring)."""

    def __init__(self, engine: sa.Engine, db: DatabaseSettings, run: Run) -> None:
        self._engine, self._db, self._run = engine, db, run
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"txn-offsets-ahead-{run.job}")
        self._read: Future[_Read] | None = None
        self._committing: tuple[OffsetRange, ...] = ()
        self._confirmed = False

    def start(self, committing: Sequence[OffsetRange]) -> None:
        """The batch of `committing` ranges starts: read the rows for the plan after it."""
        self._committing, self._confirmed = tuple(committing), False
        self._read = self._pool.submit(self._read_rows)

    def confirm(self) -> None:
        """Every range of the batch committed: the rows read meanwhile may plan the next batch."""
        self._confirmed = True

    def take(
        self, kafka: KafkaSettings, selection: TopicSelection, limits: Limits, *, timeout_s: float = 15.0
    ) -> Plan | None:
        """The next plan from the rows read ahead and Kafka's watermarks now; None: plan as always
        (the batch did not all commit, the rows could not be read, or the plan would move offsets)."""
        read, self._read = self._read, None
        if read is None or not self._confirmed:
            return None
        try:
            ahead = read.result(timeout=timeout_s)
        except Exception as exc:  # Fenced, a lost connection...: the plan made as always meets it
            logger.debug("job %r: no plan ahead (%s)", self._run.job, type(exc).__name__)
            return None
        if ahead.first_plan:
            return None
        topics = selection.resolve(kafka, timeout_s)
        infos, marks = metadata.topics_and_watermarks(kafka, topics, timeout_s=timeout_s)
        topic_ids = {topic: info.topic_id for topic, info in infos.items()}
        partitions = [(t, p) for t in topics for p in infos[t].partitions]
        return plan_settled(ahead.rows, partitions, marks, limits, topic_ids, committing=self._committing)

    def close(self) -> None:
        """Wait for a read in flight (it renews the lease: not after the run released it)."""
        self._read = None
        self._pool.shutdown(wait=True)

    def _read_rows(self) -> _Read:
        """plan_batch's transaction, without its moves: the lease renewed (Fenced if a newer run
        took the job), the lineage pruned when due, the job's offset rows read."""
        db, run = self._db, self._run
        with translate_errors(db), self._engine.begin() as conn:
            state = renew_lease(conn, db, run)
            lineage.prune_due(conn, db, run.job)  # bounded, at most every few minutes (retention)
            rows = offset_rows.load_rows(conn, db, run.job)
        return _Read(rows, state.first_plan_at is None)
