"""One run of a job, described once: :class:`JobSpec`, and the run's lifecycle, :func:`job_run`.

``run_job`` and ``open_stream`` take the same keywords (which topics, where a first run starts,
batch caps, the data-loss policy, how tasks read, the lease); each builds one frozen ``JobSpec``
from them, validated here and nowhere else, and hands it on instead of a dozen loose keywords.

Both then live through the same lifecycle: an engine for the driver, the preflight (tables there,
topics there: a misconfigured run does not even bump the generation), the role check (a job the
database role may not use is refused; a superuser or the schema owner is warned about), a new
run (fencing every older one), and at the end the lease released and the engine closed - whatever
happened between. Under :func:`shared_engines` (``run_jobs``: many jobs of one application) the
runs of this thread take their driver engine from there instead, one for all the jobs on the same
database, and leave it open.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, TxnOffsetsError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits, OnDataLoss, TopicSelection, check_on_data_loss, preflight
from txn_offsets.spark.frames import Execution, check_execution
from txn_offsets.spark.gathering import Gathering
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.store.budget import ConnectionBudget, check_server
from txn_offsets.store.database import engine_for, translate_errors
from txn_offsets.store.many_runs import StartRequest, end_runs, start_runs
from txn_offsets.store.roles import check_run_role
from txn_offsets.store.runs import Run, StartTicket, end_run, new_run_id, start_run

__all__ = [
    "JobSpec",
    "JointStarts",
    "end_quietly",
    "in_shared_engines",
    "job_run",
    "preflight_jobs",
    "shared_engines",
]

logger = logging.getLogger(__name__)

_local = threading.local()


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
    spec: JobSpec, database: DatabaseSettings, kafka: KafkaSettings, *, budget: ConnectionBudget | None = None
) -> Iterator[tuple[sa.Engine, Run]]:
    """The driver's engine and a new run of ``spec.job`` (fencing older runs), after the
    preflight (and with `budget`, the server's free connections read on the engine's first
    connection, which the run keeps); at exit the lease is released (quietly, see
    :func:`end_quietly`) and the engine closed. A failed preflight or start changes nothing and
    leaves nothing open."""
    shared: Mapping[DatabaseSettings, sa.Engine] = getattr(_local, "engines", {})
    engine = shared.get(database) or engine_for(database)
    own = database not in shared
    try:
        if budget is not None:
            with translate_errors(database), engine.connect() as conn:
                check_server(conn, database, budget)
        if (database, kafka, spec.selection.topics) not in getattr(_local, "preflighted", ()):
            preflight(engine, database, kafka, job=spec.job, selection=spec.selection)
        run = _start(engine, database, spec)
    except BaseException:
        if own:
            engine.dispose()
        raise
    try:
        yield engine, run
    finally:
        _end(engine, database, run)
        if own:
            engine.dispose()


def _start(engine: sa.Engine, database: DatabaseSettings, spec: JobSpec) -> Run:
    """The role check and the run's start: with the other jobs starting meanwhile under
    :func:`shared_engines` (one transaction, :mod:`txn_offsets.store.many_runs`), else alone - as
    a job does whose joint start was refused or failed, going on with the same ticket."""
    starts: JointStarts | None = getattr(_local, "starts", None)
    ticket = StartTicket(spec.job, new_run_id())
    if starts is not None:
        run = starts.ask((engine, database), StartRequest(ticket, spec.force, spec.lease_s))
        if run is not None:
            return run
    # a job the role may not use fails here; a superuser or the schema owner is warned about
    check_run_role(engine, database, spec.job)
    return start_run(engine, database, spec.job, force=spec.force, lease_s=spec.lease_s, resume=ticket)


def _end(engine: sa.Engine, database: DatabaseSettings, run: Run) -> None:
    """Release the run's lease: with the other jobs' runs ending meanwhile under
    :func:`shared_engines` (one statement), else - or where that failed - alone."""
    starts: JointStarts | None = getattr(_local, "starts", None)
    if starts is not None and starts.ends.ask((engine, database), run) is not None:
        return
    end_quietly(engine, database, run)


class JointStarts(Gathering[tuple[sa.Engine, DatabaseSettings], StartRequest, Run]):
    """The runs of many jobs (``run_jobs``) started together: the starts asked for at the same time
    are one transaction (:func:`~txn_offsets.store.many_runs.start_runs`) per database; and
    (``ends``) their leases released together when they end at the same time
    (:func:`~txn_offsets.store.many_runs.end_runs`)."""

    def __init__(self) -> None:
        super().__init__("start", lambda key, requests: start_runs(*key, requests))
        self.ends: Gathering[tuple[sa.Engine, DatabaseSettings], Run, bool] = Gathering(
            "end", lambda key, runs: end_runs(*key, runs)
        )


def in_shared_engines(database: DatabaseSettings) -> bool:
    """Whether this thread's runs on `database` use a shared engine (:func:`shared_engines`)."""
    return database in getattr(_local, "engines", {})


@contextlib.contextmanager
def shared_engines(
    engines: Mapping[DatabaseSettings, sa.Engine],
    preflighted: Sequence[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]] = (),
    starts: JointStarts | None = None,
) -> Iterator[None]:
    """The runs this thread starts inside the block use these driver engines (per database
    settings) instead of one of their own each, and leave them open: their owner disposes of them.
    One pool for many jobs opens connections as they are needed, up to the pool's size, and
    compiles each statement once, not once per job. A run whose (database, Kafka, topics) is in
    `preflighted` skips its own preflight: its owner checked them for all its jobs at once
    (:func:`preflight_jobs`). With `starts`, the runs start together with the other threads'
    runs starting at the same time."""
    _local.engines = engines
    _local.preflighted = preflighted
    _local.starts = starts
    try:
        yield
    finally:
        _local.engines = {}
        _local.preflighted = ()
        _local.starts = None


def preflight_jobs(
    engines: Mapping[DatabaseSettings, sa.Engine],
    jobs: Sequence[tuple[str, DatabaseSettings, KafkaSettings, TopicSelection]],
) -> list[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]]:
    """The preflight of many runs' listed topics at once (one per database and Kafka cluster: the
    tables checked once, every topic described in one request): what passed, for
    :func:`shared_engines`. Where it fails (a missing topic of one job), those runs preflight on
    their own, so the error stays with its job; runs given a topic pattern always do."""
    groups: dict[tuple[DatabaseSettings, KafkaSettings], list[tuple[str, TopicSelection]]] = {}
    for job, db, kafka, selection in jobs:
        if selection.pattern is None and db in engines:
            groups.setdefault((db, kafka), []).append((job, selection))
    passed: list[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]] = []
    for (db, kafka), members in groups.items():
        topics = tuple(sorted({t for _, selection in members for t in selection.topics}))
        try:
            preflight(engines[db], db, kafka, job=members[0][0], selection=TopicSelection(topics))
        except TxnOffsetsError as exc:
            logger.info(
                "joint preflight of %d job(s) failed (%s): each checks alone",
                len(members),
                type(exc).__name__,
            )
            continue
        passed.extend((db, kafka, selection.topics) for _, selection in members)
    return passed


def end_quietly(engine: sa.Engine, database: DatabaseSettings, run: Run) -> None:
    """Release the lease; if the database is gone, say so without hiding the error in flight
    (the lease then simply expires)."""
    try:
        end_run(engine, database, run)
    except (TxnOffsetsError, SQLAlchemyError) as exc:
        logger.warning("job=%r could not release its lease (%s); it expires by itself", run.job, exc)
