"""Scale faults (issue 24): F1b, F1's driver kills on a topic of 1,024 partitions; F19, a driver
running many jobs in shared rounds killed.

F1b: every batch is about a thousand ranges, so a kill lands with hundreds of claims in flight, some
committed and some not, spread over the Spark tasks: each restart must plan from exactly what was
committed (I1-I3 after every kill, lost=0 duplicated=0 at the end). Full suite only: a run at 1,024
partitions takes tens of seconds per restart, more than the smoke's budget in ``make test``.

F19: ``run_jobs`` runs :data:`JOBS` jobs (each on a topic of its own, all in one schema) in shared
rounds, where a round task commits its jobs' ranges in ONE transaction (``txn_offsets.commit.commit_units``).
The driver is killed -9 at seeded points - while a range is read, after a unit's claim inside the
joint transaction, just before its COMMIT, after it, or by a timer - and Python workers crash
(``os._exit``) after a claim on a round task's first attempt, so Spark retries the round task with
the joint transaction rolled back. Each kill is followed by a restart of all the jobs (--force);
every job is checked (I1-I3, lineage) after every kill and at the end. Full suite only.
"""

from __future__ import annotations

from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, scenario
from chaos.scenarios.processes import driver_kills

PARTITIONS = 1_024
KILLS = 3  # at most: each restart is a new JVM and ~1,000 ranges per batch
JOBS = 4  # F19: jobs sharing the driver, the rounds and the schema
JOB_KILLS = 5  # F19: at most; one per kill point (timer, read, after_claim, commit, after_commit)
JOB_PARTITIONS = 4  # F19: each job's topic
CRASH_RATE = 0.1  # F19: ranges whose round task's first attempt loses its Python worker after the claim


@scenario("F1b")
def f1b_driver_kills_many_partitions(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of the driver at F1's seeded points on 1,024 partitions, each followed by a restart."""
    # a few records per partition per batch: several batches of ~1,000 ranges per run
    return driver_kills(
        ctx,
        "F1b",
        messages,
        min(kills, KILLS),
        parts=PARTITIONS,
        min_per_partition=5,
        first_batch_s=240.0,
        # the page views are skewed (a partition holds up to ~15 % of the records): a small cap
        # would take hundreds of batches to catch up, so the final run reads it all at once
        final_per_partition=messages,
    )


@scenario("F19")
def f19_many_jobs_driver_kills(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of a driver running JOBS jobs in shared rounds (joint commits), worker crashes inside
    the joint transaction; a restart of every job after each kill."""
    return driver_kills(
        ctx,
        "F19",
        messages,
        min(kills, JOB_KILLS),
        parts=JOB_PARTITIONS,
        min_per_partition=20,
        jobs=JOBS,
        crash_rate=CRASH_RATE,
    )
