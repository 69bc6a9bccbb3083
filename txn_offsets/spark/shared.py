"""What the jobs of one ``run_jobs`` call share: :class:`Shared`, handed down each job's run loop.

``run_jobs`` (:mod:`txn_offsets.spark.many`) builds ONE :class:`Shared` for all its jobs and passes
it to each job's run loop as a parameter (a ``run_job`` alone has none): the driver engines (one per
database), the preflight made for all at once, the runs' starts and ends made together, the plans of
the moment made together, and the shared rounds that carry the batches of the jobs that fit them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.shared import SharedPlans
from txn_offsets.spark.rounds import Rounds
from txn_offsets.spark.spec import JobSpec, SharedStarts, job_run
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

__all__ = ["Shared"]


@dataclass(frozen=True, kw_only=True)
class Shared:
    """The many-jobs context of one ``run_jobs`` call (its owner closes what it holds)."""

    #: one driver engine per database for all the jobs on it, left open by their runs
    engines: Mapping[DatabaseSettings, sa.Engine]
    #: (database, Kafka, topics) that passed the preflight made for all the jobs at once
    preflighted: Collection[tuple[DatabaseSettings, KafkaSettings, tuple[str, ...]]]
    starts: SharedStarts  # the runs' starts (and ends) of the moment: one transaction
    plans: SharedPlans  # the plans of the moment: one Kafka request and one transaction
    rounds: Rounds | None = None  # the shared rounds (None: every job runs Spark jobs of its own)
    in_rounds: frozenset[str] = frozenset()  # the jobs whose batches go to the rounds

    def job_run(
        self, spec: JobSpec, database: DatabaseSettings, kafka: KafkaSettings
    ) -> AbstractContextManager[tuple[Store, Run]]:
        """:func:`~txn_offsets.spark.spec.job_run` with the shared engines, preflight and starts."""
        return job_run(
            spec, database, kafka, engines=self.engines, preflighted=self.preflighted, starts=self.starts
        )

    def rounds_of(self, job: str) -> Rounds | None:
        """The rounds `job`'s batches go to, or None (its batches run Spark jobs of their own)."""
        return self.rounds if job in self.in_rounds else None
