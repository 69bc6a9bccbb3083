"""run_job: a job's batches (plan -> run -> collect outcomes), or its low-latency epochs, until stopped.

Both live through one run loop (:func:`~txn_offsets.spark.loop.run_loop`: the run, its summary,
publisher, signals, retries and stop conditions); this module gives it the batch mode's step - plan
the next batch (from the last batch's plan while the job catches up, see :data:`REPLAN_EVERY_S`) and
run it - or the low-latency one (:mod:`txn_offsets.spark.lowlatency.epochs`). One log line per batch:
ranges, records, outcomes, duration and the lag left.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import BatchFailed, ConfigError, TxnOffsetsError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, Plan, PlanRequest, plan_batch, plan_next
from txn_offsets.plan.shared import SharedPlans
from txn_offsets.spark.batch import Batch, Deadlines, check_execution, spark_error_summary, spark_group
from txn_offsets.spark.loop import Pace, Step, Stepped, run_loop
from txn_offsets.spark.lowlatency.epochs import check_low_latency, epoch_steps
from txn_offsets.spark.lowlatency.options import LowLatency
from txn_offsets.spark.read_ahead import ReadAhead
from txn_offsets.spark.session import session_cores
from txn_offsets.spark.shared import Shared
from txn_offsets.spark.spec import JobSpec
from txn_offsets.spark.summary import BatchReport, JobSummary
from txn_offsets.spark.tasks import ReadOptions, success_counts
from txn_offsets.spark.writers import ComputesFirst, Writer
from txn_offsets.store.budget import check_budget
from txn_offsets.store.handle import Store
from txn_offsets.store.lease import LeaseKeeper
from txn_offsets.store.runs import Run

__all__ = ["REPLAN_EVERY_S", "run_job", "run_member"]

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
    return run_member(
        spark,
        None,
        job=job,
        kafka=kafka,
        database=database,
        writer=writer,
        topics=topics,
        topic_pattern=topic_pattern,
        start=start,
        limits=limits,
        batch_interval_s=batch_interval_s,
        max_batches=max_batches,
        until_caught_up=until_caught_up,
        on_data_loss=on_data_loss,
        force=force,
        lease_s=lease_s,
        read=read,
        stop=stop,
        on_batch=on_batch,
        retries=retries,
        retry_backoff_s=retry_backoff_s,
        batch_timeout_s=batch_timeout_s,
        mirror_group=mirror_group,
        execution=execution,
        max_store_connections=max_store_connections,
        low_latency=low_latency,
    )


def run_member(
    spark: Any,
    shared: Shared | None,
    /,
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
    """:func:`run_job`, as one of the jobs of ``run_jobs`` (:mod:`txn_offsets.spark.many`) when
    `shared` is given: the engines, preflight, starts, plans and rounds its jobs share."""
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
    pace = Pace(
        batch_interval_s=batch_interval_s,
        max_batches=max_batches,
        until_caught_up=until_caught_up,
        retries=retries,
        retry_backoff_s=retry_backoff_s,
    )
    if not lease_s > batch_interval_s:
        raise ConfigError(
            "lease_s",
            f"{lease_s}s must be longer than batch_interval_s ({batch_interval_s}s): between batches "
            f"nothing renews the lease, so it would lapse and a second run could start without force",
        )
    check_execution(execution, spark)
    # the server's free connections are read on the run's first connection (run_loop), or under
    # run_jobs for all its jobs at once
    budget = check_budget(database, session_cores(spark), max_store_connections, server=False)
    stop = stop or threading.Event()
    options = check_low_latency(low_latency, writer, spark, execution) if low_latency is not None else None

    def steps(store: Store, run: Run) -> AbstractContextManager[Step]:
        """The mode's step over the run the loop started (a plain call: its values stay in view)."""
        if options is None:
            return _batch_steps(
                store,
                run,
                spark=spark,
                spec=spec,
                kafka=kafka,
                writer=writer,
                shared=shared,
                pace=pace,
                stop=stop,
            )
        return epoch_steps(
            store,
            run,
            spark=spark,
            spec=spec,
            kafka=kafka,
            writer=writer,  # type: ignore[arg-type]  # checked: a PartitionWriter
            options=options,
            stop=stop,
            until_caught_up=until_caught_up,
            mirror_group=mirror_group,
        )

    return run_loop(
        spec,
        steps,
        database=database,
        kafka=kafka,
        pace=pace,
        stop=stop,
        budget=budget,
        # the publisher mirrors each batch's ranges; the epochs mirror the table's offsets themselves
        mirror_group=mirror_group if low_latency is None else None,
        on_batch=on_batch,
        shared=shared,
        then="planning again from the stored offsets"
        if low_latency is None
        else "planning the next epoch from the stored offsets",
    )


@contextlib.contextmanager
def _batch_steps(
    store: Store,
    run: Run,
    *,
    spark: Any,
    spec: JobSpec,
    kafka: KafkaSettings,
    writer: Writer,
    shared: Shared | None,
    pace: Pace,
    stop: threading.Event,
) -> Iterator[Step]:
    """The batch mode's step over `run`: plan the next batch and run it. For the whole run it holds
    the lease keeper (renewing the lease while a batch runs) and, unless its batches go to shared
    rounds (whose Spark job has the deadline), one Spark job group with each batch's deadline and,
    for a writer that computes first (BatchWriter), the next batch computed while this one commits
    (:mod:`txn_offsets.spark.read_ahead`; under run_jobs the jobs overlap one another instead)."""
    rounds = shared.rounds_of(spec.job) if shared is not None else None
    plans = shared.plans if shared is not None else None
    lease = LeaseKeeper(store, run, every_s=max(1.0, spec.lease_s / 3))
    carried: Plan | None = None  # the last batch's plan, once it committed whole
    next_plans = _PlanAhead()  # the plan after the running batch's, while its Spark job runs
    planned_at = 0.0  # monotonic time of the last fresh plan
    # the run's Spark jobs in one job group, set once (in shared rounds the round's job has it)
    group = spark_group(spark, f"txn-offsets-{run.run_id}") if rounds is None else None
    with contextlib.closing(lease), group or contextlib.nullcontext() as interrupt:
        deadlines = Deadlines(interrupt) if interrupt is not None else None
        ahead = (
            ReadAhead(spark, writer.compute_batch, interrupt)
            if interrupt is not None and isinstance(writer, ComputesFirst)
            else None
        )

        def batch_of(number: int, plan: Plan) -> Batch:
            return Batch(
                number,
                plan.ranges,
                spark,
                store.settings,  # the database the tasks commit to
                kafka,
                run,
                spec.read,
                spec.execution,
                shared_round=rounds.submit if rounds is not None else None,
            )

        def recent() -> bool:
            """Whether the last fresh plan is recent enough to plan from the last batch's."""
            return time.monotonic() - planned_at < REPLAN_EVERY_S

        def plan_after(committed: Plan | None) -> Plan:
            """The next batch's plan: from the last one's while it is recent, else a fresh one."""
            nonlocal planned_at
            plan = next_plans.after(committed, spec.limits) if committed and recent() else None
            if plan is None:
                planned_at = time.monotonic()
                plan = _fresh_plan(store, kafka, spec=spec, run=run, plans=plans)
            return plan

        def step(number: int) -> Stepped | None:
            nonlocal carried
            committed, carried = carried, None  # a batch that fails is planned afresh
            # the batch computed while the one before it committed, if that is the batch to run
            taken = ahead.take(committed, number) if ahead is not None else None
            plan, computed = taken if taken is not None else (plan_after(committed), None)
            if not plan.ranges:
                return None
            batch = batch_of(number, plan)
            last = pace.max_batches is not None and number >= pace.max_batches
            if ahead is None and not last and recent():
                next_plans.start(plan, spec.limits)  # while this batch's Spark job runs

            def read_next() -> None:
                """Once this batch is computed: compute the next one while this one commits, if it
                can be planned without a round trip and the run goes on after this batch."""
                if ahead is None or last or stop.is_set() or not recent():
                    return
                following = plan_next(plan, spec.limits)
                if following is not None:
                    ahead.start(plan, following, batch_of(number + 1, following))

            with lease.during(spec.batch_timeout_s):
                stepped = _run_batch(
                    batch,
                    writer,
                    deadlines,
                    timeout_s=spec.batch_timeout_s,
                    lag_after=plan.lag_after,
                    computed=computed,
                    computed_then=read_next,
                )
            carried = plan
            return stepped

        try:
            yield step
        finally:
            next_plans.close()
            if ahead is not None:
                ahead.close()
            if deadlines is not None:
                deadlines.close()


class _PlanAhead:
    """The plan after a running batch's (:func:`plan_next`), worked out on a thread of the run while
    that batch's Spark job runs, where the driver would otherwise wait for the job: at 4,096
    partitions plan_next builds ~4,096 ranges, 11-35 ms (p50 ~15) of the ~35 ms the driver spent
    between one batch's Spark job and the next one's (one batch ~0.43 s). plan_next is pure, so
    the plan is the one the driver would make after the commit; the run takes it only for the plan
    it was started from, once that batch committed whole (``carried``), and otherwise plans as
    before. Used by every run that does not read ahead: a BatchWriter's own run plans and computes
    its next batch while this one commits instead (:mod:`txn_offsets.spark.read_ahead`)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._from: Plan | None = None
        self._next: Future[Plan | None] | None = None

    def start(self, plan: Plan, limits: Limits) -> None:
        """Work out the plan after `plan` in the background."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="txn-offsets-plan-next")
        self._from, self._next = plan, self._pool.submit(plan_next, plan, limits)

    def after(self, committed: Plan, limits: Limits) -> Plan | None:
        """:func:`plan_next` of `committed`: the one started from it, else made now."""
        started, future = self._from, self._next
        self._from = self._next = None
        if future is not None and started is committed:
            return future.result()
        return plan_next(committed, limits)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _fresh_plan(
    store: Store,
    kafka: KafkaSettings,
    *,
    spec: JobSpec,
    run: Run,
    plans: SharedPlans | None,
) -> Plan:
    """The next batch from the stored offsets and Kafka's ends: under run_jobs (`plans`), made with
    the other jobs' plans of the moment; alone, or what a shared plan does not do (seed, skip,
    raise), plan_batch's."""
    request = PlanRequest(run, spec.selection, spec.limits, spec.start, spec.on_data_loss)
    plan = plans.plan(store, kafka, request) if plans is not None else None
    return plan or plan_batch(
        store,
        kafka,
        job=run.job,
        selection=spec.selection,
        start=spec.start,
        limits=spec.limits,
        on_data_loss=spec.on_data_loss,
        run=run,  # renews the lease in the plan's transaction; Fenced if a newer run started
    )


def _run_batch(
    batch: Batch,
    writer: Writer,
    deadlines: Deadlines | None,
    *,
    timeout_s: float | None,
    lag_after: int,
    computed: Callable[[], Any] | None = None,
    computed_then: Callable[[], None] | None = None,
) -> Stepped:
    """Commit `batch` with `writer` (under `deadlines`, its Spark jobs cancelled after `timeout_s`);
    what it committed. A task's error is raised; a Spark failure is a transient BatchFailed.

    A writer that computes first (:class:`ComputesFirst`) computes the batch - or takes `computed`,
    the result of its compute started earlier - then calls `computed_then`, then commits."""
    run, number = batch.run, batch.number
    t0 = time.monotonic()
    # in shared rounds (run_jobs) the round's Spark job has the deadline: no job group of our own
    watch = (
        deadlines.during(f"txn-offsets-{run.run_id}-{number}", timeout_s)
        if deadlines is not None
        else contextlib.nullcontext(threading.Event())
    )
    try:
        with watch as expired:
            if isinstance(writer, ComputesFirst):
                result = computed() if computed is not None else writer.compute_batch(batch)
                if computed_then is not None:
                    computed_then()
                reports = writer.commit_computed(batch, result)
            else:
                reports = writer.commit(batch)
    except TxnOffsetsError:
        raise
    except Exception as exc:
        if expired.is_set():
            detail = f"still running after batch_timeout_s={timeout_s:g}s; its Spark job was cancelled"
            raise BatchFailed(run.job, number, detail) from None
        raise BatchFailed(run.job, number, spark_error_summary(exc)) from exc
    for task in reports:
        if task.error is not None:
            raise task.error
    records = sum(r.records for r in reports if r.records > 0)
    counts = success_counts(reports)
    committed, already = counts[Outcome.COMMITTED], counts[Outcome.ALREADY_COMMITTED]
    report = BatchReport(
        job=run.job,
        number=number,
        ranges=len(batch.ranges),
        records=records,
        committed=committed,
        already_committed=already,
        seconds=time.monotonic() - t0,
        lag=lag_after,
    )
    logger.info(
        "job=%r batch=%d ranges=%d records=%d committed=%d already_committed=%d seconds=%.2f lag=%d",
        *(run.job, number, len(batch.ranges), records, committed, already, report.seconds, lag_after),
    )
    return Stepped(report, reports)
