"""Many jobs in one Spark application: each job's ``run_job`` loop on its own thread.

A team with dozens of small jobs does not start a JVM per job: it runs them side by side on one
cluster. :func:`run_jobs` starts one thread per job in the calling process, on the one session it
is given. Each thread runs its Spark jobs in its own job group (``run_job`` sets one per batch,
``txn-offsets-<run id>-<batch>``; thread-local under PySpark's pinned-thread mode, the default) and
in its own scheduler pool (``spark.scheduler.pool`` = the job's name, a thread-local property): with
``spark.scheduler.mode=FAIR`` set when the session is built, the pools share the executors' slots
instead of queueing behind one another's batches. Without FAIR the jobs are just as exact, only the
batches of the others wait while one job's batch holds every slot (a warning says so).

On a classic session the jobs with a PartitionWriter share their Spark jobs (``shared_rounds``, the
default; :mod:`txn_offsets.spark.rounds`): the batches they have ready run as ONE Spark job, each
job's ranges committed by its own task body under its own run, instead of one Spark job per job
and batch, whose fixed cost dominates small batches.

Every job is a separate run with its own generation, lease and offset rows: the jobs share the
offsets tables, not a row, so none waits on another's locks. What they do at the same moments is
done together: the runs that start at once start in one transaction (each job's start in a
savepoint of its own, :func:`txn_offsets.store.runs.start_runs`), and the plans asked for at once are
one Kafka request and one transaction (:mod:`txn_offsets.plan.shared`). All that the jobs share is
ONE :class:`~txn_offsets.spark.shared.Shared`, built here and passed to each job's run loop as a
parameter. A job that fails does not stop the others (unless ``stop_on_error``):
:class:`JobsResult` holds each job's summary or error.

SIGTERM/SIGINT (when called from the main thread) stop every job between its batches, like a single
``run_job`` (signal handlers can only be installed in the main thread, so the threads install none).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.plan.shared import SharedPlans
from txn_offsets.spark import session
from txn_offsets.spark.rounds import Rounds
from txn_offsets.spark.runner import run_member
from txn_offsets.spark.shared import Shared
from txn_offsets.spark.signals import stop_on_signals
from txn_offsets.spark.spec import SharedStarts, preflight_jobs
from txn_offsets.spark.summary import JobSummary
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store.budget import check_jobs_budget
from txn_offsets.store.database import DRIVER_POOL, engine_for

__all__ = ["POOL_PROPERTY", "JobsFailed", "JobsResult", "run_jobs"]

logger = logging.getLogger(__name__)

POOL_PROPERTY = "spark.scheduler.pool"
# what run_jobs passes itself: not accepted among a job's keyword arguments
_OWN = frozenset({"spark", "job", "stop"})


class JobsFailed(Exception):
    """Raised by :meth:`JobsResult.raise_for_errors`: the jobs that failed, each with its error."""

    def __init__(self, errors: Mapping[str, BaseException]) -> None:
        self.errors = dict(errors)
        shown = "; ".join(f"{job!r}: {type(exc).__name__}: {exc}" for job, exc in sorted(self.errors.items()))
        super().__init__(f"{len(self.errors)} job(s) failed: {shown}")


@dataclass
class JobsResult:
    """Each job's run_job summary (it finished) or error (it raised)."""

    summaries: dict[str, JobSummary] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    rounds: int = 0  # shared rounds run (one Spark job each; 0: none shared)
    round_batches: int = 0  # the jobs' batches they carried
    plans: int = 0  # plans asked for together (shared) (a job's first plan and those after are)
    shared_plans: int = 0  # the shared plans that made them (one Kafka request and transaction each)
    shared_starts: int = 0  # the transactions that started the runs together (store.runs.start_runs)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise JobsFailed(self.errors)


def run_jobs(
    spark: Any,
    jobs: Mapping[str, Mapping[str, Any]],
    *,
    stop: threading.Event | None = None,
    stop_on_error: bool = False,
    pools: bool = True,
    shared_rounds: bool = True,
) -> JobsResult:
    """Run every job of `jobs` (job name -> run_job's keyword arguments, without spark/job/stop) at
    once, each on its own thread of this process and in its own scheduler pool (named after the job;
    ``pools=False``: the default pool); return when all have returned.

    With `shared_rounds` (classic Spark), the batches of the jobs with a PartitionWriter run in
    shared rounds, one Spark job for the batches the jobs have ready (:mod:`txn_offsets.spark.rounds`):
    the same commits, without a Spark job's fixed cost per job and batch.

    `stop` stops them all between batches (so do SIGTERM/SIGINT from the main thread); with
    `stop_on_error` the first job that fails stops the others too. Bad arguments of any job raise
    ConfigError before any job starts, and so do jobs that together need more PostgreSQL
    connections than the server has free (:func:`~txn_offsets.store.budget.check_jobs_budget`).
    """
    if not jobs:
        raise ConfigError("jobs", "no job given: pass {job name: run_job keyword arguments}")
    for name, options in jobs.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("jobs", f"a job name must be a non-empty string, got {name!r}")
        clash = sorted(_OWN & set(options))
        if clash:
            raise ConfigError(f"jobs[{name!r}]", f"{', '.join(clash)} is set by run_jobs: leave it out")
    connect = session.is_connect(spark)
    members = {name for name, opts in jobs.items() if shared_rounds and not connect and _rounds_fit(opts)}
    apart = len(jobs) - len(members)  # jobs with Spark jobs of their own
    if pools and not connect and apart > 1 and _scheduler_mode(spark) != "FAIR":
        logger.warning(
            "run_jobs: spark.scheduler.mode is not FAIR: the %d jobs' batches queue behind one another "
            "(FIFO); build the session with spark.scheduler.mode=FAIR to share the slots",
            apart,
        )
    slots = session.session_cores(spark)
    users = Counter(o["database"] for o in jobs.values() if isinstance(o.get("database"), DatabaseSettings))
    for db, n in users.items():  # all the jobs together, before any starts: each job checks its own share
        check_jobs_budget(db, n, slots)
    stop = stop or threading.Event()
    result = JobsResult()
    lock = threading.Lock()
    engines = {
        db: engine_for(db, pool_size=DRIVER_POOL[0] * n, max_overflow=DRIVER_POOL[1] * n)
        for db, n in users.items()
    }  # one driver engine per database, as large as the jobs' own pools were: opened as needed
    shared = Shared(
        engines=engines,
        # their listed topics and the tables checked once for all (what fails, each job checks alone)
        preflighted=preflight_jobs(engines, _selections(jobs)),
        starts=SharedStarts(),  # the runs' starts of the moment: one transaction
        plans=SharedPlans(),  # the jobs' plans of the moment: one Kafka request, one transaction
        rounds=Rounds(spark, timeout_s=_round_timeout([jobs[n] for n in members])) if members else None,
        in_rounds=frozenset(members),
    )

    def one(name: str, options: Mapping[str, Any]) -> None:
        rounds = shared.rounds_of(name)  # its Spark jobs are the rounds'
        # thread-local: this thread's Spark jobs go to this pool
        pool = pools and not connect and rounds is None
        in_pool = session.local_property(spark, POOL_PROPERTY, name) if pool else contextlib.nullcontext()
        try:
            with in_pool, rounds.member() if rounds is not None else contextlib.nullcontext():
                summary = run_member(spark, shared, job=name, stop=stop, **options)
        except BaseException as exc:  # kept for the caller, who decides
            logger.error("job=%r failed: %s: %s", name, type(exc).__name__, exc)
            with lock:
                result.errors[name] = exc
            if stop_on_error:
                stop.set()
        else:
            with lock:
                result.summaries[name] = summary

    threads = [
        threading.Thread(target=one, args=(name, options), name=f"txn-offsets-job-{name}", daemon=True)
        for name, options in jobs.items()
    ]
    restore = stop_on_signals(stop)  # a no-op off the main thread
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # a bounded join keeps the main thread responsive to signals
                thread.join(0.5)
    finally:
        restore()
        for engine in engines.values():
            engine.dispose()
        result.plans, result.shared_plans = shared.plans.plans, shared.plans.calls
        result.shared_starts = shared.starts.calls
        if shared.rounds is not None:
            shared.rounds.close()
            result.rounds, result.round_batches = shared.rounds.count, shared.rounds.batches
            logger.info(
                "run_jobs: %d batches of %d jobs in %d shared rounds",
                shared.rounds.batches,
                len(members),
                shared.rounds.count,
            )
    return result


def _selections(
    jobs: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, DatabaseSettings, KafkaSettings, TopicSelection]]:
    """Each job's database, Kafka and topics, where its arguments name them well (else its own
    run_job reports what is wrong)."""
    out = []
    for name, options in jobs.items():
        db, kafka = options.get("database"), options.get("kafka")
        if not isinstance(db, DatabaseSettings) or not isinstance(kafka, KafkaSettings):
            continue
        with contextlib.suppress(ConfigError, TypeError):
            out.append(
                (name, db, kafka, TopicSelection.of(options.get("topics", ()), options.get("topic_pattern")))
            )
    return out


def _rounds_fit(options: Mapping[str, Any]) -> bool:
    """Whether a job's batches can go to shared rounds: a PartitionWriter on the RDD path, not low-latency."""
    return (
        isinstance(options.get("writer"), PartitionWriter)
        and options.get("low_latency") is None
        and options.get("execution", "auto") in ("auto", "rdd")
    )


def _round_timeout(members: list[Mapping[str, Any]]) -> float | None:
    """The rounds' deadline: the smallest batch_timeout_s of the member jobs (run_job's default 600 s)."""
    timeouts = [t for t in (options.get("batch_timeout_s", 600.0) for options in members) if t is not None]
    return min(timeouts) if timeouts else None


def _scheduler_mode(spark: Any) -> str:
    return str(spark.conf.get("spark.scheduler.mode", "FIFO")).upper()  # one call, not a copy of the conf
