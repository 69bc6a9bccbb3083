"""The micro-batch runner: plan -> run -> collect outcomes, until stopped.

A new run of a job fences every older run (generation + lease). The loop stops between batches on
SIGTERM/SIGINT, after ``max_batches``, or (``until_caught_up``) when a plan finds nothing to read.
One log line per batch: ranges, records, outcomes, duration and the lag left.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed, ConfigError, TopicChanged, Transient, TxnOffsetsError
from txn_offsets.kafka import described
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits, Plan, plan_batch, plan_next
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark import joint_plans, rounds
from txn_offsets.spark.batch import Batch, Deadlines, check_execution, spark_group
from txn_offsets.spark.joint_plans import JobPlanRequest
from txn_offsets.spark.lowlatency.options import LowLatency
from txn_offsets.spark.publish import BatchPublisher
from txn_offsets.spark.retry import TransientRetries
from txn_offsets.spark.session import session_cores
from txn_offsets.spark.signals import stop_on_signals
from txn_offsets.spark.spec import JobSpec, in_shared_engines, job_run
from txn_offsets.spark.summary import KEPT_OUTCOMES, BatchReport, JobSummary
from txn_offsets.spark.tasks import ReadOptions, success_counts
from txn_offsets.spark.writers import Writer
from txn_offsets.store.budget import check_budget
from txn_offsets.store.lease import LeaseKeeper
from txn_offsets.store.runs import Run

__all__ = ["BatchReport", "JobSummary", "run_job"]

logger = logging.getLogger(__name__)

#: While a job catches up (full batches), a batch is planned from the last one's plan (plan_next) for at
#: most this long after a fresh plan (which finds new partitions and Kafka's ends; ~10-20 ms each).
REPLAN_EVERY_S = 5.0


def run_job(
    spark: Any,
    *,
    job: str,
    kafka: KafkaSettings,
    database: DatabaseSettings,
    writer: Writer,
    topics: Sequence[str] = (),
    topic_pattern: str | None = None,
    start: StartPolicy | None = None,
    limits: Limits | None = None,
    batch_interval_s: float = 5.0,
    max_batches: int | None = None,
    until_caught_up: bool = False,
    on_data_loss: str = "fail",
    force: bool = False,
    lease_s: float = 60.0,
    read: ReadOptions | None = None,
    stop: threading.Event | None = None,
    on_batch: Callable[[BatchReport], None] | None = None,
    retries: int = 3,
    retry_backoff_s: float = 1.0,
    batch_timeout_s: float | None = 600.0,
    mirror_group: str | None = None,
    execution: str = "auto",
    max_store_connections: int | None = None,
    low_latency: LowLatency | None = None,
) -> JobSummary:
    """Run `job` on `spark` until stopped; returns a summary. Raises our errors with context.

    A transient failure (a Spark job that failed after Spark's own task retries, Kafka or
    PostgreSQL unreachable, a commit whose outcome was "not applied", a topic missing after the run
    started, e.g. while it is deleted and created again) is retried up to `retries` times in a row
    by planning again from the stored offsets - the same path a restart takes, so nothing is lost
    or applied twice. Conflicts, fencing, rejected records and data loss are never retried.

    A batch whose Spark job is still running after `batch_timeout_s` (a frozen or lost executor
    holding its range) is cancelled - Spark kills its tasks - and fails as a transient BatchFailed;
    the lease is renewed only until then. None: no timeout.

    With `mirror_group`, the committed offsets are also stored in that Kafka consumer group after
    each batch's database commit (best effort, never read back) so Kafka's lag tools see the job.

    `max_store_connections` caps the PostgreSQL connections of the run (driver and executors, see
    :mod:`txn_offsets.store.budget`); a run that needs more, or more than the server has free,
    fails at start with a ConfigError naming it. The summary's ``max_connections`` is the budget.

    With `low_latency` (a :class:`~txn_offsets.spark.lowlatency.LowLatency`) the job runs in epochs
    of long-running tasks that commit small ranges every few milliseconds
    (:mod:`txn_offsets.spark.lowlatency`); `max_batches` then counts epochs.
    """
    spec = JobSpec.of(
        job=job,
        topics=topics,
        topic_pattern=topic_pattern,
        start=start,
        limits=limits,
        on_data_loss=on_data_loss,
        read=read,
        lease_s=lease_s,
        batch_timeout_s=batch_timeout_s,
        execution=execution,
        force=force,
    )
    if batch_interval_s < 0:
        raise ConfigError("batch_interval_s", f"must be >= 0 seconds, got {batch_interval_s}")
    if max_batches is not None and max_batches <= 0:
        raise ConfigError("max_batches", f"must be > 0 or None, got {max_batches}")
    if not lease_s > batch_interval_s:
        raise ConfigError(
            "lease_s",
            f"{lease_s}s must be longer than batch_interval_s ({batch_interval_s}s): between batches "
            f"nothing renews the lease, so it would lapse and a second run could start without force",
        )
    if retries < 0 or retry_backoff_s < 0:
        raise ConfigError("retries", f"{retries=} and {retry_backoff_s=} must be >= 0")
    check_execution(execution, spark)
    # the server's free connections: under run_jobs checked for all the jobs at once; else on the
    # run's first connection (job_run), or here in low-latency mode
    alone = not in_shared_engines(database)
    server_now = alone and low_latency is not None
    budget = check_budget(database, session_cores(spark), max_store_connections, server=server_now)
    stop = stop or threading.Event()
    if low_latency is not None:
        from txn_offsets.spark.lowlatency.epochs import check_low_latency, run_epochs

        options = check_low_latency(low_latency, writer, spark, execution)
        return run_epochs(
            spark,
            spec,
            database=database,
            kafka=kafka,
            writer=writer,  # type: ignore[arg-type]  # checked: a PartitionWriter
            options=options,
            stop=stop,
            max_epochs=max_batches,
            until_caught_up=until_caught_up,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            mirror_group=mirror_group,
            on_batch=on_batch,
        )
    with job_run(spec, database, kafka, budget=budget if alone else None) as (engine, run):
        loop = _Loop(
            spark=spark,
            spec=spec,
            run=run,
            engine=engine,
            database=database,
            kafka=kafka,
            writer=writer,
            summary=JobSummary(job=job, generation=run.generation, max_connections=budget.budget),
            publisher=BatchPublisher(
                engine,
                database,
                kafka,
                job,
                mirror_group=mirror_group,
                on_batch=on_batch,
                generation=run.generation,
            ),
            lease=LeaseKeeper(engine, database, run, every_s=max(1.0, lease_s / 3)),
        )
        started = time.monotonic()
        restore = stop_on_signals(stop)
        # the run's Spark jobs in one job group, set once (in shared rounds the round's job has it)
        group = spark_group(spark, f"txn-offsets-{run.run_id}") if rounds.current() is None else None
        try:
            with group or contextlib.nullcontext() as interrupt:
                loop.deadlines = Deadlines(interrupt) if interrupt is not None else None
                _loop(
                    loop,
                    stop=stop,
                    max_batches=max_batches,
                    until_caught_up=until_caught_up,
                    batch_interval_s=batch_interval_s,
                    retries=retries,
                    retry_backoff_s=retry_backoff_s,
                )
        except BaseException as exc:
            loop.publisher.run_failed(exc)
            raise
        finally:
            for part in (loop.lease, loop.deadlines, loop.publisher):  # in this order
                if part is not None:
                    part.close()
            restore()
            loop.summary.seconds = time.monotonic() - started
    return loop.summary


@dataclass
class _Loop:
    """What every batch of one run shares (the run's context, built once by run_job)."""

    spark: Any
    spec: JobSpec
    run: Run
    engine: Any
    database: DatabaseSettings
    kafka: KafkaSettings
    writer: Writer
    summary: JobSummary
    publisher: BatchPublisher
    lease: LeaseKeeper
    carried: Plan | None = None  # the last batch's plan, once it committed whole
    deadlines: Deadlines | None = None  # each batch's batch_timeout_s (None: in shared rounds)
    planned_at: float = 0.0  # monotonic time of the last fresh plan


def _loop(
    loop: _Loop,
    *,
    stop: threading.Event,
    max_batches: int | None,
    until_caught_up: bool,
    batch_interval_s: float,
    retries: int,
    retry_backoff_s: float,
) -> None:
    """Plan and run batches until stopped; transient failures plan again from the stored offsets."""
    summary = loop.summary
    retry = TransientRetries(loop.run.job, retries, retry_backoff_s, stop)
    while True:
        if stop.is_set():
            summary.stopped_by = "signal"
            return
        try:
            worked = _step(loop)
        except Transient as exc:  # planning again from the stored offsets may get past it
            if isinstance(exc, TopicChanged):  # the next plan describes the topic again
                described.forget([exc.topic])
            retry.wait_after(exc)
            continue
        retry.succeeded()
        if worked:
            if max_batches is not None and summary.batches >= max_batches:
                summary.stopped_by = "max_batches"
                return
            continue
        if until_caught_up:
            summary.stopped_by = "caught_up"
            return
        stop.wait(batch_interval_s)


def _step(loop: _Loop) -> bool:
    """Plan (see REPLAN_EVERY_S), and run one batch if there is anything to read; True if a batch ran."""
    spec = loop.spec
    committed, loop.carried = loop.carried, None  # a batch that fails is planned afresh
    recent = time.monotonic() - loop.planned_at < REPLAN_EVERY_S
    plan = plan_next(committed, spec.limits) if committed and recent else None
    if plan is None:
        plan = _fresh_plan(loop)
    if not plan.ranges:
        return False
    with loop.lease.during(spec.batch_timeout_s):
        _run_batch(loop, plan.ranges, lag_after=plan.lag_after)
    loop.carried = plan
    return True


def _fresh_plan(loop: _Loop) -> Plan:
    """The next batch from the stored offsets and Kafka's ends: under run_jobs, made with the other
    jobs' plans of the moment; alone, or what a joint plan does not do (seed, skip, raise), plan_batch's."""
    spec = loop.spec
    loop.planned_at = time.monotonic()
    joint = joint_plans.current()
    request = JobPlanRequest(loop.run, spec.selection, spec.limits, spec.start, spec.on_data_loss)
    plan = joint.plan(loop.engine, loop.database, loop.kafka, request) if joint is not None else None
    return plan or plan_batch(
        loop.engine,
        loop.database,
        loop.kafka,
        job=loop.run.job,
        selection=spec.selection,
        start=spec.start,
        limits=spec.limits,
        on_data_loss=spec.on_data_loss,
        run=loop.run,  # renews the lease in the plan's transaction; Fenced if a newer run started
    )


def _run_batch(loop: _Loop, ranges: tuple[OffsetRange, ...], *, lag_after: int) -> None:
    run, summary, spec = loop.run, loop.summary, loop.spec
    number = summary.batches + 1
    batch = Batch(number, ranges, loop.spark, loop.database, loop.kafka, run, spec.read, spec.execution)
    t0 = time.monotonic()
    timeout_s = spec.batch_timeout_s
    # in shared rounds (run_jobs) the round's Spark job has the deadline: no job group of our own
    watch = (
        loop.deadlines.during(f"txn-offsets-{run.run_id}-{number}", timeout_s)
        if loop.deadlines is not None
        else contextlib.nullcontext(threading.Event())
    )
    try:
        with watch as expired:
            reports = loop.writer.commit(batch)
    except TxnOffsetsError:
        raise
    except Exception as exc:
        if expired.is_set():
            detail = f"still running after batch_timeout_s={timeout_s:g}s; its Spark job was cancelled"
            raise BatchFailed(run.job, number, detail) from None
        raise BatchFailed(run.job, number, _spark_error_summary(exc)) from exc
    for task in reports:
        if task.error is not None:
            raise task.error
    records = sum(max(0, r.records) for r in reports)
    counts = success_counts(reports)
    committed, already = counts[Outcome.COMMITTED], counts[Outcome.ALREADY_COMMITTED]
    summary.batches = number
    summary.records += records
    summary.committed += committed
    summary.already_committed += already
    summary.outcomes.extend(reports)
    del summary.outcomes[:-KEPT_OUTCOMES]
    report = BatchReport(
        job=run.job,
        number=number,
        ranges=len(ranges),
        records=records,
        committed=committed,
        already_committed=already,
        seconds=time.monotonic() - t0,
        lag=lag_after,
    )
    logger.info(
        "job=%r batch=%d ranges=%d records=%d committed=%d already_committed=%d seconds=%.2f lag=%d",
        *(run.job, number, len(ranges), records, committed, already, report.seconds, lag_after),
    )
    loop.publisher.batch_committed(report, report.seconds, reports)


def _spark_error_summary(exc: BaseException) -> str:
    """The Python error inside a Spark failure, without the JVM stack trace."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        stripped = line.strip()
        if stripped.startswith(("txn_offsets.", "psycopg.", "sqlalchemy.")) or "Error:" in stripped:
            return stripped[:1000]
    return text.splitlines()[0][:1000] if text else type(exc).__name__
