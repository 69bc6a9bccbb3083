"""The low-latency mode's step: plan an epoch, run its long-running tasks, watch, account.

Each epoch is planned exactly as a batch is (``plan_batch`` with the run: the lease renewed and the
generation checked in the plan's transaction, new partitions seeded, data loss failed or skipped
as ``on_data_loss`` says), then its partitions are spread over at most one task per core and run
as ONE Spark job of long-running tasks (:class:`~txn_offsets.spark.lowlatency.follow.FollowTask`).
While it runs, the driver renews the lease, mirrors the table's offsets to the consumer group and
watches the topics (:mod:`txn_offsets.spark.lowlatency.watch`); it ends the epoch early
(:func:`~txn_offsets.spark.lowlatency.control.end_epoch`) on stop, on a new partition or a changed
topic. The epochs are the steps of the run loop batches also use
(:func:`~txn_offsets.spark.loop.run_loop`): a task's error is raised - or, when transient, planned
again from the table - as in batch mode; so is a fence the driver sees: a fenced run ends with
Fenced and publishes nothing more (no ``on_batch``, statistics or mirror).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, Fenced
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.plan.planner import plan_batch
from txn_offsets.spark import session
from txn_offsets.spark.batch import assign_ranges
from txn_offsets.spark.loop import Step, Stepped
from txn_offsets.spark.lowlatency.follow import FollowReport, FollowTask
from txn_offsets.spark.lowlatency.options import LowLatency
from txn_offsets.spark.lowlatency.watch import mirror_offsets, run_epoch_job
from txn_offsets.spark.spec import JobSpec
from txn_offsets.spark.summary import BatchReport
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

__all__ = ["check_low_latency", "epoch_steps"]

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


@contextlib.contextmanager
def epoch_steps(
    store: Store,
    run: Run,
    *,
    spark: Any,
    spec: JobSpec,
    kafka: KafkaSettings,
    writer: PartitionWriter[Any, Any],
    options: LowLatency,
    stop: threading.Event,
    until_caught_up: bool,
    mirror_group: str | None,
) -> Iterator[Step]:
    """The low-latency mode's step over `run`: plan and run one epoch (one BatchReport each). For
    the whole run it holds the consumer-group mirror of the table's offsets (sent while each epoch
    runs, and once more after the last: a run that fails, or is fenced, sends nothing more)."""
    mirror = GroupMirror(kafka, mirror_group, generation=run.generation) if mirror_group else None

    def step(number: int) -> Stepped | None:
        plan = plan_batch(
            store,
            kafka,
            job=run.job,
            selection=spec.selection,
            start=spec.start,
            limits=spec.limits,
            on_data_loss=spec.on_data_loss,
            run=run,
        )
        if until_caught_up and not plan.ranges:
            return None
        partitions = tuple(sorted(plan.stored))
        backlog = [max(1, plan.ends.get(k, 0) - plan.stored[k]) for k in partitions]
        cores = options.tasks or session.session_cores(spark)
        groups = assign_ranges(backlog, max(1, min(len(partitions), cores)))
        task = FollowTask(
            database=store.settings,  # the database the tasks commit to
            kafka=kafka,
            run=run,
            partitions=partitions,
            ends=dict(plan.ends),
            options=options,
            prepare=writer.prepare,
            write=writer.write_ranges,
            isolation_level=writer.isolation_level,
            dead_letters=writer.dead_letters,
            epoch=number,
            until_caught_up=until_caught_up,
            ends_at=time.time() + options.epoch_s,
        )
        t0 = time.monotonic()
        reports = run_epoch_job(
            spark,
            task,
            groups,
            store=store,
            selection=spec.selection,
            lease_s=spec.lease_s,
            mirror=mirror,
            stop=stop,
        )
        reached = dict(plan.stored) | {s.range.key: s.range.until for r in reports for s in r.spans}
        lag = sum(max(0, end - reached.get(k, end)) for k, end in plan.ends.items())  # left of the plan's
        return _account(run.job, number, reports, time.monotonic() - t0, lag)

    try:
        yield step
        if mirror is not None:
            # the table's last offsets; a run fenced since its last epoch sends nothing and ends
            # with Fenced, like a run fenced during one (mirror_offsets)
            mirror_offsets(store, run, mirror)
            mirror.flush()
    except BaseException as exc:
        if mirror is not None:
            mirror.halt(type(exc).__name__)
        raise
    finally:
        if mirror is not None:
            mirror.close()


def _account(job: str, number: int, reports: list[FollowReport], seconds: float, lag: int) -> Stepped:
    """Raise a task's error as batch mode does, else what the epoch committed (one log line)."""
    errors = [r.error for r in reports if r.error is not None]
    fenced = [e for e in errors if isinstance(e, Fenced)]
    if errors:
        raise (fenced or errors)[0]
    spans = [s for r in reports for s in r.spans]
    records = sum(s.records for s in spans)
    commits = sum(r.commits for r in reports)
    already = sum(r.already_committed for r in reports)
    times = sorted(ms for r in reports for ms in r.commit_ms)
    p50 = times[len(times) // 2] if times else 0.0
    stops = ",".join(sorted({r.stopped_by for r in reports}))
    logger.info(
        "job=%r epoch=%d tasks=%d records=%d commits=%d already_committed=%d commit_p50_ms=%.1f "
        "seconds=%.1f stopped_by=%s",
        job,
        number,
        len(reports),
        records,
        commits,
        already,
        p50,
        seconds,
        stops,
    )
    return Stepped(BatchReport(job, number, len(spans), records, commits, already, seconds, lag), spans)
