"""The connection budget of a run: how many PostgreSQL connections a job may open at most, and the
check at its start against the setting and against what the server still accepts.

What each process opens, at most (the pools are sized from these constants in
:mod:`txn_offsets.store.database`; a pool that is full makes the caller wait, never connect):

* the driver: :data:`DRIVER_CONNECTIONS` (the run loop's transaction and, when a commit's outcome is
  unknown, its re-read on a fresh connection; the lease keeper's heartbeat; the publisher's
  statistics);
* each Python worker of an executor: :data:`WORKER_CONNECTIONS` (a task's range transaction and
  its re-read). Spark runs at most one task per task slot (executor core), each in its own Python
  worker, so with S slots the workers open at most ``S * WORKER_CONNECTIONS``.

A run of a job on S slots therefore opens at most ``DRIVER_CONNECTIONS + S * WORKER_CONNECTIONS``
(:attr:`ConnectionBudget.needed`). ``run_job(max_store_connections=N)`` states the budget; a job
that needs more, or more than the server has free (``max_connections`` minus the reserved slots
minus the connections open now), fails at start with a ConfigError naming the setting, instead of
timing out mid-batch. Not counted: ``txn-offsets serve`` (its own process, :data:`SERVE_CONNECTIONS`)
and connections the user's own write code opens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.store.database import DRIVER_POOL, WORKER_POOL, engine_for, translate_errors
from txn_offsets.store.health import ConnectionHeadroom, connection_headroom

__all__ = [
    "DRIVER_CONNECTIONS",
    "SERVE_CONNECTIONS",
    "WORKER_CONNECTIONS",
    "ConnectionBudget",
    "check_budget",
    "check_jobs_budget",
    "check_server",
    "plan_budget",
]

logger = logging.getLogger(__name__)

DRIVER_CONNECTIONS = sum(DRIVER_POOL)  # engine_for's defaults: pool 2 + overflow 3
WORKER_CONNECTIONS = sum(WORKER_POOL)  # worker_engine: pool 1 + overflow 1
SERVE_CONNECTIONS = 9  # serve's pool 4 + overflow 4, and its readiness probe's 1


@dataclass(frozen=True)
class ConnectionBudget:
    """A run's connections at most: the driver's plus each task slot's worker."""

    slots: int
    limit: int | None  # max_store_connections (None: not stated)

    @property
    def needed(self) -> int:
        return DRIVER_CONNECTIONS + self.slots * WORKER_CONNECTIONS

    @property
    def budget(self) -> int:
        """The stated number: the setting, or what the run needs when it is not set."""
        return self.limit if self.limit is not None else self.needed


def plan_budget(slots: int, max_store_connections: int | None) -> ConnectionBudget:
    """The budget of a run on `slots` task slots; a limit below what it needs is a ConfigError."""
    limit = max_store_connections
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ConfigError("max_store_connections", f"must be a positive whole number or None, got {limit!r}")
    plan = ConnectionBudget(max(1, int(slots)), limit)
    if limit is not None and plan.needed > limit:
        raise ConfigError(
            "max_store_connections",
            f"{limit} is too few for this job: it opens up to {plan.needed} connections to PostgreSQL "
            f"({DRIVER_CONNECTIONS} on the driver + {WORKER_CONNECTIONS} per task slot x {plan.slots} "
            f"slots); raise max_store_connections to {plan.needed} or run on fewer executor cores",
        )
    return plan


def check_jobs_budget(db: DatabaseSettings, jobs: int, slots: int) -> int:
    """Many jobs of one application on `db` (``run_jobs``: one driver engine sized for all of them,
    and the workers' engines shared by every job's tasks) open at most ``jobs * DRIVER_CONNECTIONS +
    slots * WORKER_CONNECTIONS``; returns that number, or fails now if the server has fewer free -
    each job's own check at its start sees only its own share."""
    needed = jobs * DRIVER_CONNECTIONS + max(1, int(slots)) * WORKER_CONNECTIONS
    room = _headroom(db)
    if needed > room.free + 1:
        raise ConfigError(
            "jobs",
            f"these {jobs} jobs open up to {needed} connections to PostgreSQL ({DRIVER_CONNECTIONS} per "
            f"job on the driver + {WORKER_CONNECTIONS} per task slot x {slots} slots), but "
            f"{_short_of(db, room)}: run fewer jobs in this application, or raise PostgreSQL's "
            f"max_connections (or put PgBouncer in front, docs/operations.md)",
        )
    return needed


def _headroom(db: DatabaseSettings) -> ConnectionHeadroom:
    """The server's free connections, read on a connection of its own (closed before any run opens one)."""
    engine = engine_for(db, poolclass=sa.pool.NullPool)
    try:
        with translate_errors(db), engine.connect() as conn:
            return connection_headroom(conn)
    finally:
        engine.dispose()


def _short_of(db: DatabaseSettings, room: ConnectionHeadroom) -> str:
    # the check's own connection is counted in use: closed before the run opens any, or the run's first
    return (
        f"{db.display_url} has {room.free + 1} free (max_connections {room.max_connections} - "
        f"{room.reserved} reserved - {room.in_use - 1} in use)"
    )


def check_budget(
    db: DatabaseSettings, slots: int, max_store_connections: int | None, *, server: bool = True
) -> ConnectionBudget:
    """:func:`plan_budget`, then the server's free connections (one short read on a connection of
    its own): a run that could not open what it needs fails now, naming the setting and the numbers.
    ``server=False``: the setting only (``run_jobs`` has read the server for all its jobs at once;
    ``run_job`` reads it on its own first connection, :func:`check_server`)."""
    plan = plan_budget(slots, max_store_connections)
    if server:
        _refuse_if_short(db, plan, _headroom(db))
    return plan


def check_server(conn: sa.Connection, db: DatabaseSettings, plan: ConnectionBudget) -> None:
    """The server half of :func:`check_budget` on `conn`, a connection the run keeps (its first:
    counted in use, as the check's own connection is there) - no connection opened for the check."""
    _refuse_if_short(db, plan, connection_headroom(conn))


def _refuse_if_short(db: DatabaseSettings, plan: ConnectionBudget, room: ConnectionHeadroom) -> None:
    if plan.needed > room.free + 1:
        raise ConfigError(
            "max_store_connections",
            f"this job opens up to {plan.needed} connections to PostgreSQL ({DRIVER_CONNECTIONS} on the "
            f"driver + {WORKER_CONNECTIONS} per task slot x {plan.slots} slots), but "
            f"{_short_of(db, room)}: run on fewer executor cores, or raise PostgreSQL's "
            f"max_connections (or put PgBouncer in front, docs/operations.md)",
        )
    logger.info(
        "connection budget: up to %d of %d stated (%d slots); %d free on the server",
        plan.needed,
        plan.budget,
        plan.slots,
        room.free + 1,
    )
