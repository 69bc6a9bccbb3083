"""One run of a job, described once: :class:`JobSpec`, and the run's lifecycle, :func:`job_run`.

``run_job`` and ``open_stream`` take the same keywords (which topics, where a first run starts,
batch caps, the data-loss policy, how tasks read, the lease); each builds one frozen ``JobSpec``
from them, validated here and nowhere else, and hands it on instead of a dozen loose keywords.

Both then live through the same lifecycle: an engine for the driver, the preflight (tables there,
topics there: a misconfigured run does not even bump the generation), the role check (a job the
database role may not use is refused; a superuser or the schema owner is warned about), a new
run (fencing every older one), and at the end the lease released and the engine closed - whatever
happened between. Given the engines of ``run_jobs`` (many jobs of one application, see
:class:`~txn_offsets.spark.shared.Shared`) a run takes its driver engine from there instead, one for
all the jobs on the same database, and leaves it open.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, TxnOffsetsError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.data_loss import OnDataLoss, check_on_data_loss
from txn_offsets.plan.planner import Limits, TopicSelection, preflight
from txn_offsets.plan.shared import SharedAsks
from txn_offsets.spark.frames import Execution, check_execution
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.store.budget import ConnectionBudget, check_server
from txn_offsets.store.handle import Store
from txn_offsets.store.kept import release_run_store, run_store
from txn_offsets.store.roles import check_run_role
from txn_offsets.store.run_ends import note_failure
from txn_offsets.store.runs import (
    Run,
    StartRequest,
    StartTicket,
    end_run,
    end_runs,
    new_run_id,
    start_run,
    start_runs,
)

__all__ = [
    "JobSpec",
    "SharedStarts",
    "end_quietly",
    "job_run",
    "preflight_jobs",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What one run of a job reads and how: validated on construction, then passed as one value."""

    job: str
    selection: TopicSelection
    start: StartPolicy | None = None
    limits: Limits = field(default_factory=Limits)
    on_data_loss: OnDataLoss = "fail"
    read: ReadOptions = field(default_factory=ReadOptions)
    lease_s: float = 60.0
    batch_timeout_s: float | None = 600.0
    execution: Execution = "auto"
    force: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job.strip() or len(self.job) > 200:
            raise ConfigError("job", f"{self.job!r}: give a non-empty job name of at most 200 characters")
        if not isinstance(self.selection, TopicSelection):
            raise ConfigError("topics", f"expected a TopicSelection, got {type(self.selection).__name__}")
        if self.start is not None and not isinstance(self.start, StartPolicy):
            raise ConfigError(
                "start", f"expected a StartPolicy (e.g. StartPolicy.earliest()), got {self.start!r}"
            )
        if not isinstance(self.limits, Limits):
            raise ConfigError("limits", f"expected a Limits, got {type(self.limits).__name__}")
        if not isinstance(self.read, ReadOptions):
            raise ConfigError("read", f"expected a ReadOptions, got {type(self.read).__name__}")
        check_on_data_loss(self.on_data_loss)
        if (
            isinstance(self.lease_s, bool)
            or not isinstance(self.lease_s, int | float)
            or not self.lease_s > 0
        ):
            raise ConfigError("lease_s", f"must be > 0 seconds, got {self.lease_s!r}")
        if self.batch_timeout_s is not None and not self.batch_timeout_s > 0:
            raise ConfigError("batch_timeout_s", f"must be > 0 seconds or None, got {self.batch_timeout_s}")
        check_execution(self.execution)  # the session's side is checked where the session is known

    @classmethod
    def of(
        cls,
        *,
        job: str,
        topics: Sequence[str] = (),
        topic_pattern: str | None = None,
        start: StartPolicy | None = None,
        limits: Limits | None = None,
        on_data_loss: str = "fail",
        read: ReadOptions | None = None,
        lease_s: float = 60.0,
        batch_timeout_s: float | None = 600.0,
        execution: str = "auto",
        force: bool = False,
    ) -> JobSpec:
        """From the keywords of ``run_job`` / ``open_stream`` (None: the defaults)."""
        return cls(
            job=job,
            selection=TopicSelection.of(topics, topic_pattern),
            start=start,
            limits=limits if limits is not None else Limits(),
            on_data_loss=check_on_data_loss(on_data_loss),
            read=read if read is not None else ReadOptions(),
            lease_s=lease_s,
            batch_timeout_s=batch_timeout_s,
            execution=check_execution(execution),
            force=force,
        )


@contextlib.contextmanager
def job_run(
    spec: JobSpec,
    database: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    budget: ConnectionBudget | None = None,
    engines: Mapping[DatabaseSettings, sa.Engine] | None = None,
    preflighted: Collection[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]] = (),
    starts: SharedStarts | None = None,
) -> Iterator[tuple[Store, Run]]:
    """The driver's store (on its engine) and a new run of ``spec.job`` (fencing older runs), after the
    preflight (and with `budget`, the server's free connections read on the engine's first
    connection, which the run keeps); at exit (an error's class and cause noted in the run's row of
    ``job_runs`` first: :func:`~txn_offsets.store.run_ends.note_failure`) the lease is released (quietly, see
    :func:`end_quietly`) and the engine closed - or, after a run that ended cleanly, kept for this
    process's next run on the same database (:mod:`txn_offsets.store.kept`: the next run starts
    on open connections). A failed preflight or start changes nothing and leaves
    nothing open.

    ``run_jobs`` passes what its jobs share: `engines`, driver engines per database settings used
    instead of one of the run's own and left open (their owner disposes of them: one pool for many
    jobs opens connections as they are needed and compiles each statement once, not once per job);
    `preflighted`, the (database, Kafka, topics) it checked for all its jobs at once
    (:func:`preflight_jobs`), whose runs skip their own preflight; `starts`, to start (and end) the
    run together with the other jobs' runs starting (ending) at the same time."""
    shared = engines or {}
    own = database not in shared
    store = run_store(database) if own else Store(shared[database], database)
    try:
        if budget is not None:
            with store.connect() as conn:
                check_server(conn, database, budget)
        if (database, kafka, spec.selection.topics) not in preflighted:
            preflight(store, kafka, job=spec.job, selection=spec.selection)
        run = _start(store, spec, starts)
    except BaseException:
        if own:
            release_run_store(store, clean=False)
        raise
    clean = False
    try:
        yield store, run
        clean = True
    except BaseException as exc:
        note_failure(store, run, exc)  # how the run ended, in its row of `job_runs` (quietly)
        raise
    finally:
        _end(store, run, starts)
        if own:  # kept for this process's next run when this one ended cleanly
            release_run_store(store, clean=clean)


def _start(store: Store, spec: JobSpec, starts: SharedStarts | None) -> Run:
    """The role check and the run's start: with the other jobs starting meanwhile through `starts`
    (one transaction, :func:`~txn_offsets.store.runs.start_runs`), else alone - as a job does
    whose shared start was refused or failed, going on with the same ticket."""
    ticket = StartTicket(spec.job, new_run_id())
    if starts is not None:
        run = starts.ask(store, StartRequest(ticket, spec.force, spec.lease_s))
        if run is not None:
            return run
    # a job the role may not use fails here; a superuser or the schema owner is warned about
    check_run_role(store, spec.job)
    return start_run(store, spec.job, force=spec.force, lease_s=spec.lease_s, resume=ticket)


def _end(store: Store, run: Run, starts: SharedStarts | None) -> None:
    """Release the run's lease: with the other jobs' runs ending meanwhile through `starts` (one
    statement), else - or where that failed - alone."""
    if starts is not None and starts.ends.ask(store, run) is not None:
        return
    end_quietly(store, run)


class SharedStarts(SharedAsks[Store, StartRequest, Run]):
    """The runs of many jobs (``run_jobs``) started together: the starts asked for at the same time
    are one transaction (:func:`~txn_offsets.store.runs.start_runs`) per database; and
    (``ends``) their leases released together when they end at the same time
    (:func:`~txn_offsets.store.runs.end_runs`)."""

    def __init__(self) -> None:
        super().__init__("start", start_runs)
        self.ends: SharedAsks[Store, Run, bool] = SharedAsks("end", end_runs)


def preflight_jobs(
    engines: Mapping[DatabaseSettings, sa.Engine],
    jobs: Sequence[tuple[str, DatabaseSettings, KafkaSettings, TopicSelection]],
) -> list[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]]:
    """The preflight of many runs' listed topics at once (one per database and Kafka cluster: the
    tables checked once, every topic described in one request): what passed, for
    :func:`job_run`'s `preflighted`. Where it fails (a missing topic of one job), those runs preflight on
    their own, so the error stays with its job; runs given a topic pattern always do."""
    groups: dict[tuple[DatabaseSettings, KafkaSettings], list[tuple[str, TopicSelection]]] = {}
    for job, db, kafka, selection in jobs:
        if selection.pattern is None and db in engines:
            groups.setdefault((db, kafka), []).append((job, selection))
    passed: list[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]] = []
    for (db, kafka), members in groups.items():
        topics = tuple(sorted({t for _, selection in members for t in selection.topics}))
        try:
            preflight(Store(engines[db], db), kafka, job=members[0][0], selection=TopicSelection(topics))
        except TxnOffsetsError as exc:
            logger.info(
                "shared preflight of %d job(s) failed (%s): each checks alone",
                len(members),
                type(exc).__name__,
            )
            continue
        passed.extend((db, kafka, selection.topics) for _, selection in members)
    return passed


def end_quietly(store: Store, run: Run) -> None:
    """Release the lease; if the database is gone, say so without hiding the error in flight
    (the lease then simply expires)."""
    try:
        end_run(store, run)
    except (TxnOffsetsError, SQLAlchemyError) as exc:
        logger.warning("job=%r could not release its lease (%s); it expires by itself", run.job, exc)
