"""The run loop shared by batches and low-latency epochs: start a run, step until stopped, end it.

``run_job`` runs a job as batches (:mod:`txn_offsets.spark.runner`) or as epochs
(:mod:`txn_offsets.spark.lowlatency.epochs`); both live through :func:`run_loop` and differ only in
what one step does: plan and run one batch, or plan and run one epoch. The loop starts a new run of
the job (fencing every older run: generation + lease), then steps. It stops between steps on
SIGTERM/SIGINT (or `stop`), after ``max_batches`` steps, or (``until_caught_up``) when a step finds
nothing to read. A transient failure is retried by stepping again, planning from the stored
offsets (:class:`~txn_offsets.spark.retry.TransientRetries`). Every step that committed is counted
in the run's summary and published (statistics, mirror, ``on_batch``) after its commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, Fenced, TopicChanged, Transient
from txn_offsets.kafka import described
from txn_offsets.spark.heap import heap_frozen_while_running
from txn_offsets.spark.publish import BatchPublisher
from txn_offsets.spark.retry import TransientRetries
from txn_offsets.spark.shared import Shared
from txn_offsets.spark.signals import stop_on_signals
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.spark.summary import BatchReport, JobSummary
from txn_offsets.spark.tasks import TaskReport
from txn_offsets.store.budget import ConnectionBudget
from txn_offsets.store.fences import explain_fence
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

__all__ = ["Pace", "Step", "Stepped", "Steps", "run_loop"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Pace:
    """When a run's loop steps, retries and stops (``run_job``'s keywords of it, checked here)."""

    batch_interval_s: float = 5.0  # the wait after a step that found nothing to read
    max_batches: int | None = None  # stop after this many steps that committed
    until_caught_up: bool = False  # stop at the first step that finds nothing to read
    retries: int = 3  # transient failures in a row retried
    retry_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_interval_s < 0:
            raise ConfigError("batch_interval_s", f"must be >= 0 seconds, got {self.batch_interval_s}")
        if self.max_batches is not None and self.max_batches <= 0:
            raise ConfigError("max_batches", f"must be > 0 or None, got {self.max_batches}")
        if self.retries < 0 or self.retry_backoff_s < 0:
            raise ConfigError("retries", f"{self.retries=} and {self.retry_backoff_s=} must be >= 0")


@dataclass(frozen=True)
class Stepped:
    """What one step committed: its report (``on_batch``'s) and the outcomes of its ranges."""

    report: BatchReport
    outcomes: Sequence[TaskReport]


#: One step of a run: plan and run its batch (or epoch) number `number`; what it committed, or
#: None when there was nothing to read (then, with until_caught_up, the loop stops).
Step = Callable[[int], Stepped | None]

#: A mode's steps over the run just started (the store on the run's driver engine, and the run): a
#: context manager that holds the mode's own set-up around them (a batch's job group and lease
#: keeper, an epoch's mirror) and undoes it when the loop ends; an error of the loop is raised in it.
Steps = Callable[[Store, Run], AbstractContextManager[Step]]


def run_loop(
    spec: JobSpec,
    steps: Steps,
    *,
    database: DatabaseSettings,
    kafka: KafkaSettings,
    pace: Pace,
    stop: threading.Event,
    budget: ConnectionBudget,
    mirror_group: str | None,
    on_batch: Callable[[BatchReport], None] | None,
    shared: Shared | None,
    then: str = "planning again from the stored offsets",
) -> JobSummary:
    """Run ``spec.job`` through `steps` until stopped (see the module doc); its summary.

    `budget` is the run's connection budget (the summary's ``max_connections``); alone, the server's
    free connections are checked against it on the run's first connection (under ``run_jobs``,
    `shared`, they were checked for all its jobs at once). `mirror_group` and `on_batch` are the
    publisher's (:class:`~txn_offsets.spark.publish.BatchPublisher`); `then` says in the retry's
    warning what a retry does."""
    opened = (
        shared.job_run(spec, database, kafka) if shared else job_run(spec, database, kafka, budget=budget)
    )
    with opened as (store, run):
        summary = JobSummary(job=spec.job, generation=run.generation, max_connections=budget.budget)
        publisher = BatchPublisher(
            store,
            kafka,
            spec.job,
            mirror_group=mirror_group,
            on_batch=on_batch,
            generation=run.generation,
        )
        started = time.monotonic()
        restore = stop_on_signals(stop)
        try:
            with steps(store, run) as step, heap_frozen_while_running():
                _repeat(step, summary, publisher, pace=pace, stop=stop, then=then)
        except Fenced as exc:
            # what fenced the run (a newer run, a reset, an import, a retire) and what it had
            # committed, read from the store: an operator must not take "fenced" for "nothing
            # written" and replay what this run counted
            publisher.run_failed(exc)  # the mirror stops at once, before the store is asked
            running_s = time.monotonic() - started
            fenced = explain_fence(store, run, exc, batches=summary.batches, running_s=running_s)
            raise fenced.with_traceback(exc.__traceback__) from None
        except BaseException as exc:
            publisher.run_failed(exc)
            raise
        finally:
            publisher.close()
            restore()
            summary.seconds = time.monotonic() - started
    return summary


def _repeat(
    step: Step,
    summary: JobSummary,
    publisher: BatchPublisher,
    *,
    pace: Pace,
    stop: threading.Event,
    then: str,
) -> None:
    """Step until a stop condition (``summary.stopped_by`` says which); count and publish each
    step that committed; after a transient failure, step again (retries and backoff: `pace`)."""
    retry = TransientRetries(summary.job, pace.retries, pace.retry_backoff_s, stop, then=then)
    while True:
        if stop.is_set():
            summary.stopped_by = "signal"
            return
        try:
            stepped = step(summary.batches + 1)
        except Transient as exc:  # planning again from the stored offsets may get past it
            if isinstance(exc, TopicChanged):  # the next plan describes the topic again
                described.forget_descriptions([exc.topic])
            retry.wait_after(exc)
            continue
        retry.succeeded()
        if stepped is not None:
            summary.add(stepped.report, stepped.outcomes)
            publisher.batch_committed(stepped.report, stepped.report.seconds, stepped.outcomes)
            if pace.max_batches is not None and summary.batches >= pace.max_batches:
                summary.stopped_by = "max_batches"
                return
            continue
        if pace.until_caught_up:
            summary.stopped_by = "caught_up"
            return
        stop.wait(pace.batch_interval_s)
