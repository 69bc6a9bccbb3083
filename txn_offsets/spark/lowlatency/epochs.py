"""The driver of the low-latency mode: plan an epoch, run its long-running tasks, watch, repeat.

Each epoch is planned exactly as a batch is (``plan_batch`` with the run: the lease renewed and the
generation checked in the plan's transaction, new partitions seeded, data loss failed or skipped
as ``on_data_loss`` says), then its partitions are spread over at most one task per core and run
as ONE Spark job of long-running tasks (:class:`~txn_offsets.spark.lowlatency.follow.FollowTask`).
While it runs, the driver renews the lease, mirrors the table's offsets to the consumer group and
watches the topics; it ends the epoch early (:func:`~txn_offsets.spark.lowlatency.control.end_epoch`)
on stop, on a new partition or a changed topic. A task's error is raised - or, when transient,
planned again from the table - as in batch mode; so is a fence the driver sees: a fenced run ends
with Fenced and publishes nothing more (no ``on_batch``, statistics or mirror).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, Fenced, Transient
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.planner import plan_batch
from txn_offsets.spark import session
from txn_offsets.spark.batch import assign_ranges
from txn_offsets.spark.lowlatency.follow import FollowReport, FollowTask
from txn_offsets.spark.lowlatency.options import LowLatency
from txn_offsets.spark.lowlatency.watch import Epoch, mirror_offsets, run_tasks
from txn_offsets.spark.publish import BatchPublisher
from txn_offsets.spark.retry import TransientRetries
from txn_offsets.spark.signals import stop_on_signals
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.spark.summary import KEPT_OUTCOMES, BatchReport, JobSummary
from txn_offsets.spark.writers import PartitionWriter

__all__ = ["check_low_latency", "run_epochs"]

logger = logging.getLogger(__name__)


def check_low_latency(options: object, writer: object, spark: Any, execution: str) -> LowLatency:
    """Refuse what the mode cannot run, naming the fix (before anything is touched)."""
    if not isinstance(options, LowLatency):
        raise ConfigError("low_latency", f"expected a LowLatency(...), got {type(options).__name__}")
    if not isinstance(writer, PartitionWriter):
        raise ConfigError(
            "writer",
            f"low-latency mode commits each partition's small ranges in its long-running task: it needs "
            f"a PartitionWriter, got {type(writer).__name__} (a BatchWriter's shuffle over a whole "
            f"batch has no place in it; run a BatchWriter job without low_latency)",
        )
    if session.is_connect(spark) or execution == "dataframe":
        raise ConfigError(
            "low_latency",
            "low-latency mode runs its long-running tasks on the RDD path and needs a classic "
            "SparkContext (not Spark Connect, not execution='dataframe')",
        )
    return options


def run_epochs(
    spark: Any,
    spec: JobSpec,
    *,
    database: DatabaseSettings,
    kafka: KafkaSettings,
    writer: PartitionWriter[Any, Any],
    options: LowLatency,
    stop: threading.Event,
    max_epochs: int | None,
    until_caught_up: bool,
    retries: int,
    retry_backoff_s: float,
    mirror_group: str | None,
    on_batch: Callable[[BatchReport], None] | None,
) -> JobSummary:
    """run_job's loop in low-latency mode (one BatchReport per epoch; see the module doc)."""
    with job_run(spec, database, kafka) as (engine, run):
        mirror = GroupMirror(kafka, mirror_group, generation=run.generation) if mirror_group else None
        loop = Epoch(
            spark,
            spec,
            run,
            engine,
            database,
            kafka,
            writer,
            options,
            JobSummary(job=run.job, generation=run.generation),
            BatchPublisher(
                engine,
                database,
                kafka,
                run.job,
                mirror_group=None,
                on_batch=on_batch,
                generation=run.generation,
            ),
            mirror,
            stop,
            until_caught_up,
        )
        started = time.monotonic()
        restore = stop_on_signals(stop)
        try:
            _loop(loop, max_epochs=max_epochs, retries=retries, retry_backoff_s=retry_backoff_s)
            if mirror is not None:
                # the table's last offsets; in the try: a run fenced since its last epoch sends
                # nothing and ends with Fenced, like a run fenced during one (mirror_offsets)
                mirror_offsets(loop)
                mirror.flush()
        except BaseException as exc:
            loop.publisher.run_failed(exc)
            if mirror is not None:
                mirror.halt(type(exc).__name__)
            raise
        finally:
            if mirror is not None:
                mirror.close()
            loop.publisher.close()
            restore()
            loop.summary.seconds = time.monotonic() - started
    return loop.summary


def _loop(loop: Epoch, *, max_epochs: int | None, retries: int, retry_backoff_s: float) -> None:
    summary = loop.summary
    then = "planning the next epoch from the stored offsets"
    retry = TransientRetries(loop.run.job, retries, retry_backoff_s, loop.stop, then=then)
    while True:
        if loop.stop.is_set():
            summary.stopped_by = "signal"
            return
        try:
            ran = _epoch(loop)
        except Transient as exc:
            retry.wait_after(exc)
            continue
        retry.succeeded()
        if not ran:
            summary.stopped_by = "caught_up"
            return
        if max_epochs is not None and summary.batches >= max_epochs:
            summary.stopped_by = "max_batches"
            return


def _epoch(loop: Epoch) -> bool:
    """Plan and run one epoch; False if until_caught_up and there was nothing to read."""
    spec, run = loop.spec, loop.run
    plan = plan_batch(
        loop.engine,
        loop.database,
        loop.kafka,
        job=run.job,
        selection=spec.selection,
        start=spec.start,
        limits=spec.limits,
        on_data_loss=spec.on_data_loss,
        run=run,
    )
    if loop.until_caught_up and not plan.ranges:
        return False
    partitions = tuple(sorted(plan.stored))
    backlog = [max(1, plan.ends.get(k, 0) - plan.stored[k]) for k in partitions]
    cores = loop.options.tasks or session.session_cores(loop.spark)
    groups = assign_ranges(backlog, max(1, min(len(partitions), cores)))
    number = loop.summary.batches + 1
    task = FollowTask(
        database=loop.database,
        kafka=loop.kafka,
        run=run,
        partitions=partitions,
        ends=dict(plan.ends),
        options=loop.options,
        prepare=loop.writer.prepare,
        write=loop.writer.write_ranges,
        isolation_level=loop.writer.isolation_level,
        dead_letters=loop.writer.dead_letters,
        epoch=number,
        until_caught_up=loop.until_caught_up,
        ends_at=time.time() + loop.options.epoch_s,
    )
    t0 = time.monotonic()
    reports = run_tasks(loop, task, groups, number, set(partitions))
    reached = dict(plan.stored) | {s.range.key: s.range.until for r in reports for s in r.spans}
    lag = sum(max(0, end - reached.get(k, end)) for k, end in plan.ends.items())  # left of the plan's
    _account(loop, number, reports, time.monotonic() - t0, lag)
    return True


def _account(loop: Epoch, number: int, reports: list[FollowReport], seconds: float, lag: int) -> None:
    """Raise a task's error as batch mode does, else count the epoch and publish it."""
    errors = [r.error for r in reports if r.error is not None]
    fenced = [e for e in errors if isinstance(e, Fenced)]
    if errors:
        raise (fenced or errors)[0]
    spans = [s for r in reports for s in r.spans]
    summary = loop.summary
    records = sum(s.records for s in spans)
    commits = sum(r.commits for r in reports)
    already = sum(r.already_committed for r in reports)
    summary.batches = number
    summary.records += records
    summary.committed += commits
    summary.already_committed += already
    summary.outcomes.extend(spans)
    del summary.outcomes[:-KEPT_OUTCOMES]
    times = sorted(ms for r in reports for ms in r.commit_ms)
    p50 = times[len(times) // 2] if times else 0.0
    stops = ",".join(sorted({r.stopped_by for r in reports}))
    report = BatchReport(loop.run.job, number, len(spans), records, commits, already, seconds, lag)
    logger.info(
        "job=%r epoch=%d tasks=%d records=%d commits=%d already_committed=%d commit_p50_ms=%.1f "
        "seconds=%.1f stopped_by=%s",
        loop.run.job,
        number,
        len(reports),
        records,
        commits,
        already,
        p50,
        seconds,
        stops,
    )
    loop.publisher.batch_committed(report, seconds, spans)
