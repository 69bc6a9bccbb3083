"""How the driver and the long-running tasks of an epoch talk: through the job's row.

The tasks read the job row every ``check_interval_ms`` (one primary-key SELECT); the driver writes
it. Nothing new is stored: the epoch runs while the run's lease is live, so

* a newer generation (a new run, an admin reset) -> the task stops with :class:`Fenced`;
* the run's lease no longer live (the driver ended the epoch early by expiring it, the run ended,
  or the driver is gone and stopped renewing) -> the task commits what it holds and stops.

The driver renews the lease while the epoch runs and ends an epoch early with :func:`end_epoch`;
the next epoch's plan renews the lease again (``plan_batch(run=...)``), checking the generation in
the same statement, so a run fenced in between never plans another epoch.
"""

from __future__ import annotations

import sqlalchemy as sa

from txn_offsets.errors import Fenced
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, lock_job

__all__ = ["end_epoch", "epoch_live"]


def epoch_live(store: Store, run: Run) -> bool:
    """True while `run` holds a live lease; False once the driver ended the epoch (or the run, or
    stopped renewing); raises Fenced if a newer generation took the job."""
    with store.connect() as conn:
        state = lock_job(conn, store.settings, run.job, for_update=False)
        conn.rollback()
    if state.generation != run.generation:
        raise Fenced(run.job, run.generation, state.generation)
    return state.live and state.run_id == run.run_id


def end_epoch(store: Store, run: Run) -> bool:
    """Expire `run`'s lease now, so the epoch's tasks stop at their next check; False if the run
    no longer held the job (fenced). The next plan renews the lease."""
    jobs = store.tables.jobs
    with store.begin() as conn:
        ended = conn.execute(
            sa.update(jobs)
            .where(jobs.c.job == run.job, jobs.c.generation == run.generation, jobs.c.run_id == run.run_id)
            .values(lease_until=sa.func.now())
        ).rowcount
    return ended == 1
