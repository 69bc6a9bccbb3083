"""What a run tells the outside world after each batch, never before its database commit: the
batch statistics for ``txn-offsets serve`` (``job_stats``), the consumer-group mirror for Kafka's
lag tools, and the user's ``on_batch`` callback.

Statistics and the mirror are best effort and off the batch's path, so a slow or unreachable
Kafka or a busy ``job_stats`` row never delays the next batch, and their failures are logged and
counted, never raised. The table of offsets stays the only truth. Statistics go to the process's
statistics queue (:mod:`txn_offsets.store.stats_queue`: the records of all runs written together),
the mirror to the run's own background thread.

That one thread orders the run's mirror sends after its own commits, batch by batch. A run
that fails or is fenced stops the mirror at once (:meth:`BatchPublisher.run_failed`): its queued
mirror commits are dropped and ``close()`` flushes nothing, so it never writes an offset older than
one a newer run may have mirrored already (the mirror also skips entries of a newer generation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.ranges import TopicPartition
from txn_offsets.spark.tasks import TaskReport, success_counts
from txn_offsets.store import stats, stats_queue
from txn_offsets.store.handle import Store

__all__ = ["BatchPublisher"]

logger = logging.getLogger(__name__)


class BatchPublisher:
    """Publishes each committed batch of one run (statistics, mirror, ``on_batch``)."""

    def __init__(
        self,
        store: Store,
        kafka: KafkaSettings,
        job: str,
        *,
        mirror_group: str | None,
        on_batch: Callable[[Any], None] | None,
        generation: int,
    ) -> None:
        self._store = store  # where the statistics go
        self._job = job
        self._on_batch = on_batch
        self._mirror = (
            GroupMirror(
                kafka,
                mirror_group,
                generation=generation,
                on_failure=lambda: self._count_failure("mirror_failed"),
            )
            if mirror_group is not None
            else None
        )
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"publish-{job[:20]}")
        self._recorded: list[Future[bool]] = []  # this run's statistics, queued

    def batch_committed(self, report: object, seconds: float, reports: Sequence[TaskReport]) -> None:
        """After every range of the batch committed: queue statistics and the mirror, then call
        the user's callback (in this thread: its exceptions are the user's to see)."""
        try:
            self._count(stats.batch_record(self._job, seconds, success_counts(reports)))
        except Exception as exc:  # best effort: never lose the batch over a statistic
            logger.warning("job %r: batch statistics not recorded (%s)", self._job, type(exc).__name__)
        if self._mirror is not None:
            ends: dict[TopicPartition, int] = {r.range.key: r.range.until for r in reports}
            ids = {r.range.key: r.range.topic_id for r in reports if r.range.topic_id is not None}
            self._background.submit(self._mirror.commit, ends, ids)
        if self._on_batch is not None:
            self._on_batch(report)

    def run_failed(self, exc: BaseException) -> None:
        """The run ends with `exc`: stop the mirror now (what is queued for it is dropped, not sent),
        and count the failure if it is one of job_stats' (conflict, fencing, rejected record, data
        loss)."""
        if self._mirror is not None:
            self._mirror.halt(type(exc).__name__)
        outcome = exc.outcome if isinstance(exc, TxnOffsetsError) else None
        if outcome in stats.FAILURES:  # the failures job_stats counts (conflict, fenced, ...)
            self._count_failure(outcome)

    def close(self) -> None:
        """Finish what is queued (bounded by the mirror's and the statistics' own timeouts); flush the
        mirror unless the run failed."""
        if self._mirror is not None and not self._mirror.halted:
            self._background.submit(self._mirror.flush)
        self._background.shutdown(wait=True)
        if self._mirror is not None:
            self._mirror.close()
        stats_queue.wait(self._recorded)  # in job_stats once the run returns

    def _count(self, record: stats.StatRecord) -> None:
        self._recorded = [f for f in self._recorded if not f.done()]
        self._recorded.append(stats_queue.submit(self._store, record))

    def _count_failure(self, outcome: str) -> None:
        try:
            self._count(stats.failure_record(self._job, outcome))
        except Exception as exc:  # best effort: never lose the batch over a statistic
            logger.warning("job %r: failure statistic not recorded (%s)", self._job, type(exc).__name__)
