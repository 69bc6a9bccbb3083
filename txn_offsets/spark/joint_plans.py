"""The plans of many jobs in one process, made together (``run_jobs``).

Dozens of ``run_job`` loops on threads of one process each plan before every batch: a Kafka request
or three and a transaction each, on the Kafka connections and the database pool they share, all at
once after a shared round. :class:`JointPlans` gathers the plans asked for at the same time and
makes them with one Kafka request and one transaction (:func:`plan_jobs`), the
way a database's group commit gathers commits (:mod:`txn_offsets.spark.gathering`): nobody waits
for a window to fill, a plan asked alone is made alone.

A joint plan is the plan ``plan_batch`` makes for that run. A run's first plan seeds its offsets (its
start policy) in the joint transaction too, in a savepoint of its own. Where plan_batch must do more
than read after that (a partition to seed, a fenced run, data lost), or where a first plan raises,
the joint plan is None: the job then plans on its own, as it does when the joint attempt fails (a
topic of one job deleted fails the shared Kafka request: each job then meets its own error, or none).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from txn_offsets import planner
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.data_loss import OnDataLoss, lost
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka import metadata
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan_moves import settle_offsets
from txn_offsets.planner import Limits, Plan, TopicSelection, plan_from
from txn_offsets.ranges import TopicPartition
from txn_offsets.spark.gathering import Gathering
from txn_offsets.store import lineage, offset_rows
from txn_offsets.store.database import translate_errors
from txn_offsets.store.lease import renew_leases
from txn_offsets.store.runs import Run

__all__ = ["JobPlanRequest", "JointPlans", "current", "joined", "plan_jobs"]


logger = logging.getLogger(__name__)

_local = threading.local()


@dataclass(frozen=True)
class JobPlanRequest:
    """One job's next plan, asked of :func:`plan_jobs` by its run."""

    run: Run
    selection: TopicSelection
    limits: Limits
    start: StartPolicy | None = None  # where the job's first plan starts (plan_batch's `start`)
    on_data_loss: OnDataLoss = "fail"


def plan_jobs(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    requests: Sequence[JobPlanRequest],
    *,
    timeout_s: float = 15.0,
) -> list[Plan | None]:
    """The next plans of several runs (of different jobs on one store and Kafka cluster), made
    together: ONE request for the topics and watermarks of all their topics, ONE transaction that
    renews every run's lease (:func:`renew_leases`) and loads every job's offset rows. Many jobs in
    one process (``run_jobs``) plan this way instead of a few Kafka requests and a transaction each.

    Each plan is the one :func:`plan_batch` makes for that run; a run's first plan seeds its
    offsets here (by the request's start policy, in a savepoint of its own). None where plan_batch
    would do more than read after its first plan, or raise: a fenced run, a partition to seed, a
    topic id to adopt, data lost, a first plan without a start policy, a first plan while the
    topics' description is a reused one (planner.DESCRIBED_FOR_S).
    The caller then plans that job with plan_batch, which does (or raises) what is due.
    A Kafka or database error here is raised for all: the callers then plan one by one, so an
    error stays with the job it belongs to."""
    topics_of = [r.selection.resolve(kafka, timeout_s) for r in requests]
    infos, marks = metadata.topics_and_watermarks(
        kafka,
        sorted({t for topics in topics_of for t in topics}),
        timeout_s=timeout_s,
        reuse_within_s=planner.DESCRIBED_FOR_S,
    )
    topic_ids = {topic: info.topic_id for topic, info in infos.items()}
    seeding = all(info.described for info in infos.values())  # a first plan seeds on Kafka's word of now
    with translate_errors(db), engine.begin() as conn:
        states = renew_leases(conn, db, [r.run for r in requests])
        for job in states:
            lineage.prune_due(conn, db, job)  # bounded, at most every few minutes (retention)
        rows = offset_rows.load_rows_of(conn, db, list(states))
        firsts = {
            request.run.job: _first_plan(conn, db, kafka, request, topics, infos, marks, timeout_s)
            for request, topics in zip(requests, topics_of, strict=True)
            if seeding and request.run.job in states and states[request.run.job].first_plan_at is None
        }
    plans: list[Plan | None] = []
    for request, topics in zip(requests, topics_of, strict=True):
        state = states.get(request.run.job)
        if state is None or state.first_plan_at is None:
            plans.append(firsts.get(request.run.job))
            continue
        partitions = [(t, p) for t in topics for p in infos[t].partitions]
        job_rows = rows[request.run.job]
        stored: dict[TopicPartition, int] = {}
        for tp in partitions:
            row = job_rows.get(tp)
            if row is None or row.topic_id is None or lost(row, topic_ids[tp[0]], marks[tp]) is not None:
                break  # a move (seed, adopt, skip) or an error: plan_batch's
            stored[tp] = row.off
        else:
            plans.append(plan_from(stored, marks, partitions, request.limits, topic_ids))
            continue
        plans.append(None)
    return plans


def _first_plan(  # noqa: PLR0917 - the joint plan's own values, passed on
    conn: sa.Connection,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    request: JobPlanRequest,
    topics: list[str],
    infos: Mapping[str, metadata.TopicInfo],
    marks: Mapping[TopicPartition, tuple[int, int]],
    timeout_s: float,
) -> Plan | None:
    """A run's first plan in the joint transaction, in a savepoint of its own: the offsets seeded
    by its start policy (what plan_batch moves, :func:`~txn_offsets.plan_moves.settle_offsets`),
    then its ranges; None where that raises (no start policy, data lost, fenced): the savepoint
    is rolled back and the job's own plan_batch raises it."""
    topic_ids = {t: infos[t].topic_id for t in topics}
    partitions = [(t, p) for t in topics for p in infos[t].partitions]
    try:
        with conn.begin_nested():
            stored, settled = settle_offsets(
                conn,
                db,
                kafka,
                job=request.run.job,
                partitions=partitions,
                marks=marks,
                topic_ids=topic_ids,
                first_plan=True,
                start=request.start,
                on_data_loss=request.on_data_loss,
                timeout_s=timeout_s,
                generation=request.run.generation,
            )
    except TxnOffsetsError as exc:
        logger.info(
            "job %r: its first plan with others raised %s; it plans alone",
            request.run.job,
            type(exc).__name__,
        )
        return None
    return plan_from(stored, settled, partitions, request.limits, topic_ids)


class JointPlans(Gathering[tuple[Any, DatabaseSettings, KafkaSettings], JobPlanRequest, Plan]):
    """Plans asked for at the same time, made together (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__("plan", lambda key, requests: plan_jobs(*key, requests))

    @property
    def plans(self) -> int:
        """Plans asked for."""
        return self.asked

    def plan(
        self, engine: Any, database: DatabaseSettings, kafka: KafkaSettings, request: JobPlanRequest
    ) -> Plan | None:
        """`request`'s plan made jointly with the others asked for meanwhile; None: plan alone."""
        return self.ask((engine, database, kafka), request)


def current() -> JointPlans | None:
    """The joint plans this thread's runs use (inside :func:`joined`), else None."""
    plans: JointPlans | None = getattr(_local, "plans", None)
    return plans


@contextlib.contextmanager
def joined(plans: JointPlans) -> Iterator[None]:
    """This thread's runs plan through `plans`."""
    _local.plans = plans
    try:
        yield
    finally:
        _local.plans = None
