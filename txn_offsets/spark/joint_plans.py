"""The plans of many jobs in one process, made together (``run_jobs``).

Dozens of ``run_job`` loops on threads of one process each plan before every batch: a Kafka request
or three and a transaction each, on the Kafka connections and the database pool they share, all at
once after a shared round. :class:`JointPlans` gathers the plans asked for at the same time and
makes them with one Kafka request and one transaction (:func:`plan_jobs`), the
way a database's group commit gathers commits: the first thread to ask plans for itself and for
every thread that asks while it does, then hands the next gathering to the first of those that
came meanwhile. Nobody waits for a window to fill: a plan asked alone is made alone.

A joint plan is the plan ``plan_batch`` makes for that run, or None where plan_batch must do more
than read (the first plan, a partition to seed, a fenced run, data lost): the job then plans on its
own, as it does when the joint attempt fails (a topic of one job deleted fails the shared Kafka
request: each job then meets its own error, or none).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.data_loss import lost
from txn_offsets.kafka import metadata
from txn_offsets.planner import Limits, Plan, TopicSelection, plan_from
from txn_offsets.ranges import TopicPartition
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

    Each plan is the one :func:`plan_batch` makes for that run, or None where plan_batch would do
    more than read: a fenced run, the job's first plan, a partition to seed, a topic id to adopt,
    data lost. The caller then plans that job with plan_batch, which does (or raises) what is due.
    A Kafka or database error here is raised for all: the callers then plan one by one, so an
    error stays with the job it belongs to."""
    topics_of = [r.selection.resolve(kafka, timeout_s) for r in requests]
    infos, marks = metadata.topics_and_watermarks(
        kafka, sorted({t for topics in topics_of for t in topics}), timeout_s=timeout_s
    )
    topic_ids = {topic: info.topic_id for topic, info in infos.items()}
    with translate_errors(db), engine.begin() as conn:
        states = renew_leases(conn, db, [r.run for r in requests])
        for job in states:
            lineage.prune_due(conn, db, job)  # bounded, at most every few minutes (retention)
        rows = offset_rows.load_rows_of(conn, db, list(states))
    plans: list[Plan | None] = []
    for request, topics in zip(requests, topics_of, strict=True):
        state = states.get(request.run.job)
        if state is None or state.first_plan_at is None:
            plans.append(None)
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


@dataclass(eq=False)
class _Ask:
    engine: Any
    database: DatabaseSettings
    kafka: KafkaSettings
    request: JobPlanRequest
    served: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # this thread makes the next gathering's plans
    plan: Plan | None = None


class JointPlans:
    """Plans asked for at the same time, made together (see the module's docstring)."""

    def __init__(self) -> None:
        self.plans = 0  # plans asked for
        self.gatherings = 0  # plan_jobs calls that made them
        self._lock = threading.Lock()
        self._pending: list[_Ask] = []
        self._busy = False

    def plan(
        self, engine: Any, database: DatabaseSettings, kafka: KafkaSettings, request: JobPlanRequest
    ) -> Plan | None:
        """`request`'s plan made jointly with the others asked for meanwhile; None: plan alone."""
        ask = _Ask(engine, database, kafka, request)
        with self._lock:
            self.plans += 1
            self._pending.append(ask)
            if not self._busy:
                self._busy = ask.lead = True
        if not ask.lead:
            ask.served.wait()  # served by a leader, or made the next one
        if ask.lead:
            self._lead()
        return ask.plan

    def _lead(self) -> None:
        with self._lock:
            gathered, self._pending = self._pending, []
        try:
            self._make(gathered)
        finally:
            with self._lock:
                if self._pending:  # asked while these were made: the first of them leads next
                    self._pending[0].lead = True
                    self._pending[0].served.set()
                else:
                    self._busy = False
            for ask in gathered:
                ask.lead = False
                ask.served.set()

    def _make(self, gathered: list[_Ask]) -> None:
        groups: dict[tuple[int, DatabaseSettings, KafkaSettings], list[_Ask]] = {}
        for ask in gathered:
            groups.setdefault((id(ask.engine), ask.database, ask.kafka), []).append(ask)
        for asks in groups.values():
            self.gatherings += 1
            first = asks[0]
            try:
                plans = plan_jobs(first.engine, first.database, first.kafka, [a.request for a in asks])
            except Exception as exc:  # each job plans on its own and meets its own error, if any
                logger.info(
                    "joint plan of %d job(s) failed (%s): each plans alone", len(asks), type(exc).__name__
                )
                continue
            for ask, plan in zip(asks, plans, strict=True):
                ask.plan = plan


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
