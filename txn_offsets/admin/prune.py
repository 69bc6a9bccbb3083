"""``offsets prune``: delete a job's lineage (``commits`` rows) by count or by age, audited.

A run prunes its own job's lineage by age as it plans (:func:`txn_offsets.store.lineage.prune_due`);
nothing prunes a job that no longer runs. This is the operator's prune: of one job, or of every
retired job (``jobs retire`` keeps the lineage with the offsets), either keeping the newest
``keep`` rows of each partition or deleting the rows older than ``older_than_s`` (default: the
retention, ``DatabaseSettings.lineage_retention_days``). Per job, one transaction: one DELETE that
reports per partition what it deleted, and one ``lineage_prune`` audit row per pruned partition
(``old`` the first offset whose commit row is gone, ``new`` the end of the last one). No offset
moves, so no run is disturbed: the job row is only read (``FOR KEY SHARE``, as a claim reads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.admin.views import is_retired
from txn_offsets.errors import ConfigError
from txn_offsets.store.audit import OffsetChange, check_audit, default_actor, write_audit
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, validate_job

__all__ = ["Pruned", "prune_lineage", "retired_jobs"]


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted of one job's lineage."""

    job: str
    deleted: int
    partitions: int


def _check(keep: int | None, older_than_s: float | None) -> None:
    if keep is not None and older_than_s is not None:
        raise ConfigError("--keep/--older-than", "give one of them, not both")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ConfigError("--keep", f"{keep!r}: give a whole number >= 1 (rows kept per partition)")
    if older_than_s is not None and (
        isinstance(older_than_s, bool)
        or not isinstance(older_than_s, int | float)
        or not math.isfinite(older_than_s)
        or not 0 < older_than_s <= 100 * 365 * 86400
    ):
        raise ConfigError("--older-than", f"{older_than_s!r}: give a duration > 0 (e.g. 30d), <= 100 years")


def retired_jobs(store: Store) -> list[str]:
    """The jobs retired by ``jobs retire`` and not started since, by name."""
    j = store.tables.jobs
    with store.connect() as conn:
        return list(conn.scalars(sa.select(j.c.job).where(is_retired(j)).order_by(j.c.job)))


def prune_lineage(
    store: Store,
    job: str,
    *,
    reason: str,
    keep: int | None = None,
    older_than_s: float | None = None,
    actor: str | None = None,
) -> Pruned:
    """Delete `job`'s commits rows beyond the newest `keep` of each partition, or older than
    `older_than_s` seconds (neither: older than the retention), and audit it. UnknownJob or
    ConfigError (bad numbers, no reason) change nothing."""
    validate_job(job)
    _check(keep, older_than_s)
    who = actor or default_actor()
    check_audit("lineage_prune", reason, who)
    c = store.tables.commits
    if keep is not None:
        newest_first = sa.func.row_number().over(partition_by=(c.c.topic, c.c.part), order_by=c.c.id.desc())
        ranked = sa.select(c.c.id, newest_first.label("n")).where(c.c.job == job).subquery()
        doomed = sa.select(ranked.c.id).where(ranked.c.n > keep)
    else:
        seconds = (
            store.settings.lineage_retention_days * 86400.0 if older_than_s is None else float(older_than_s)
        )
        cutoff = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds)
        doomed = sa.select(c.c.id).where(c.c.job == job, c.c.committed_at < cutoff)
    gone = (
        sa.delete(c)
        .where(c.c.job == job, c.c.id.in_(doomed))
        .returning(c.c.topic, c.c.part, c.c.from_off, c.c.until_off)
        .cte("gone")
    )
    per_partition = sa.select(
        gone.c.topic,
        gone.c.part,
        sa.func.min(gone.c.from_off).label("first"),
        sa.func.max(gone.c.until_off).label("last"),
        sa.func.count().label("rows"),
    ).group_by(gone.c.topic, gone.c.part)
    with store.begin() as conn:
        state = lock_job(conn, store.settings, job, for_update=False, key_share=True)
        rows = conn.execute(per_partition.order_by(gone.c.topic, gone.c.part)).all()
        changes = [OffsetChange(r.topic, r.part, int(r.first), int(r.last)) for r in rows]
        write_audit(
            conn,
            store.settings,
            job,
            changes,
            action="lineage_prune",
            reason=reason,
            actor=who,
            generation=state.generation,
        )
    return Pruned(job, sum(int(r.rows) for r in rows), len(rows))
