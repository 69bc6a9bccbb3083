"""Per job batch statistics for the metrics service: a batch duration histogram and outcome counters.

The runner counts each batch and each batch that ends in a conflict, fencing, a rejected record,
data loss or a failed mirror (:func:`record_batch`, :func:`record_failure`; :func:`record_many`
counts the records of many jobs at once, as :mod:`txn_offsets.store.stats_queue` gathers them from
the runs of a process). Each call is one short transaction of its own on the ``job_stats`` table -
never inside a batch's transaction, never on a job or offset row - with tight lock and statement
timeouts, and best effort: statistics must never fail or stall a job, so a failure is logged
(without the database's message, which could echo values) and reported as False.

``txn-offsets serve`` reads them with :func:`load_stats` (a plain SELECT).
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, TxnOffsetsError
from txn_offsets.store.database import sqlstate
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import BATCH_SECONDS_BUCKETS, STAT_OUTCOMES, tables_for

__all__ = [
    "BATCH_SECONDS_BUCKETS",
    "STAT_OUTCOMES",
    "JobStats",
    "StatRecord",
    "batch_record",
    "failure_record",
    "load_stats",
    "record_batch",
    "record_failure",
    "record_many",
]

logger = logging.getLogger(__name__)

FAILURES = ("conflict", "fenced", "rejected", "data_loss", "mirror_failed")
_LOCK_TIMEOUT = "2s"
_STATEMENT_TIMEOUT = "5s"


@dataclass(frozen=True)
class JobStats:
    """The cumulative statistics of one job."""

    job: str
    batches: int
    batch_seconds_sum: float
    buckets: tuple[int, ...]  # non-cumulative, one per BATCH_SECONDS_BUCKETS bound, then +Inf
    outcomes: Mapping[str, int]

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs as Prometheus histograms expose them, ending with +Inf."""
        bounds = [*(repr(float(b)) for b in BATCH_SECONDS_BUCKETS), "+Inf"]
        out, total = [], 0
        for le, count in zip(bounds, self.buckets, strict=False):
            total += count
            out.append((le, total))
        return out


def bucket_index(seconds: float) -> int:
    """0-based bucket of a duration: the first bound >= it (the +Inf bucket past the last)."""
    return bisect.bisect_left(BATCH_SECONDS_BUCKETS, seconds)


def _check(job: str, seconds: float | None, outcomes: Mapping[str, int]) -> None:
    if not isinstance(job, str) or not job.strip():
        raise ConfigError("job", f"{job!r}: give the job's name")
    if seconds is not None and (
        not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0
    ):
        raise ConfigError("seconds", f"{seconds!r}: a batch duration is a finite number >= 0")
    for name, count in outcomes.items():
        if name not in STAT_OUTCOMES:
            raise ConfigError("outcome", f"{name!r}: use one of {', '.join(STAT_OUTCOMES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("outcome", f"{name}={count!r}: counts are integers >= 0")


@functools.lru_cache(maxsize=16)
def _upsert(schema: str) -> sa.Insert:
    """The one statement that counts a batch or a failure (built once per schema, its values
    bound): a new job's row with these counts, or these counts added to its row - the buckets
    element by element, so the batch's bucket is a bound vector, not part of the statement."""
    t = tables_for(schema).stats
    ins = pg_insert(t).values(
        job=sa.bindparam("job"),
        batches=sa.bindparam("batches", type_=sa.BigInteger),
        batch_seconds_sum=sa.bindparam("seconds", type_=sa.Double),
        batch_buckets=sa.bindparam("buckets", type_=sa.ARRAY(sa.BigInteger)),
        last_batch_at=sa.case((sa.bindparam("batches", type_=sa.BigInteger) > 0, sa.func.now())),
        updated_at=sa.func.now(),
        **{name: sa.bindparam(name, type_=sa.BigInteger) for name in STAT_OUTCOMES},
    )
    new = ins.excluded
    dialect: sa.Dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    target = dialect.identifier_preparer.format_table(t)
    summed = sa.literal_column(
        "ARRAY(SELECT coalesce(x.a, 0) + coalesce(x.b, 0) "  # noqa: S608 - a quoted identifier of a validated schema
        f"FROM unnest({target}.batch_buckets, excluded.batch_buckets) WITH ORDINALITY AS x(a, b, n) "
        "ORDER BY x.n)",
        sa.ARRAY(sa.BigInteger),
    )
    return ins.on_conflict_do_update(
        index_elements=[t.c.job],
        set_={
            "batches": t.c.batches + new.batches,
            "batch_seconds_sum": t.c.batch_seconds_sum + new.batch_seconds_sum,
            "batch_buckets": summed,
            "last_batch_at": sa.func.coalesce(new.last_batch_at, t.c.last_batch_at),
            "updated_at": sa.func.now(),
            **{name: getattr(t.c, name) + getattr(new, name) for name in STAT_OUTCOMES},
        },
    )


@dataclass(frozen=True)
class StatRecord:
    """One thing to count for a job: a finished batch (its duration and its ranges' outcomes), or a
    failure (``seconds`` None, one failure outcome). Checked when made (:func:`batch_record`,
    :func:`failure_record`)."""

    job: str
    seconds: float | None
    outcomes: Mapping[str, int]


def batch_record(job: str, seconds: float, outcomes: Mapping[str, int]) -> StatRecord:
    """A finished batch to count; ConfigError for arguments that are wrong in themselves."""
    _check(job, seconds, outcomes)
    return StatRecord(job, float(seconds), dict(outcomes))


def failure_record(job: str, outcome: str) -> StatRecord:
    """A failure to count: ``conflict``, ``fenced``, ``rejected``, ``data_loss`` or ``mirror_failed``."""
    if outcome not in FAILURES:
        raise ConfigError("outcome", f"{outcome!r}: use one of {', '.join(FAILURES)}")
    _check(job, None, {outcome: 1})
    return StatRecord(job, None, {outcome: 1})


def _values(job: str, records: Sequence[StatRecord]) -> dict[str, object]:
    """The bound values that add all of `records` (one job's) to its row."""
    buckets = [0] * (len(BATCH_SECONDS_BUCKETS) + 1)
    timed = [r.seconds for r in records if r.seconds is not None]
    for seconds in timed:
        buckets[bucket_index(seconds)] += 1
    return {
        "job": job,
        "batches": len(timed),
        "seconds": float(sum(timed)),
        "buckets": buckets,
        **{name: sum(int(r.outcomes.get(name, 0)) for r in records) for name in STAT_OUTCOMES},
    }


def record_many(store: Store, records: Sequence[StatRecord]) -> bool:
    """Count `records` (of any jobs) in ONE transaction: one upsert row per job, their sums. Best
    effort: False (and a warning naming the jobs) if they could not be recorded."""
    by_job: dict[str, list[StatRecord]] = {}
    for record in records:
        by_job.setdefault(record.job, []).append(record)
    if not by_job:
        return True
    values = [_values(job, rows) for job, rows in sorted(by_job.items())]  # a fixed lock order
    try:
        with store.begin() as conn:
            # bound, transaction-local: a stuck holder of the stats row costs seconds, not the job
            conn.execute(
                sa.select(
                    sa.func.set_config("lock_timeout", _LOCK_TIMEOUT, True),
                    sa.func.set_config("statement_timeout", _STATEMENT_TIMEOUT, True),
                )
            )
            conn.execute(_upsert(store.schema), values)
    except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
        state = sqlstate(exc)
        logger.warning(
            "job=%s batch statistics not recorded (%s%s); the job is not affected",
            ", ".join(repr(job) for job in sorted(by_job)),
            type(exc).__name__,
            f", sqlstate {state}" if state else "",
        )
        return False
    return True


def record_batch(store: Store, job: str, seconds: float, outcomes: Mapping[str, int]) -> bool:
    """Count one finished batch of `job`: its duration and its ranges' outcomes (e.g.
    ``{"committed": 8, "already_committed": 0}``). Best effort: False (and a warning) if it could
    not be recorded; raises ConfigError only for arguments that are wrong in themselves."""
    return record_many(store, [batch_record(job, seconds, outcomes)])


def record_failure(store: Store, job: str, outcome: str) -> bool:
    """Count one failure of `job`: ``conflict``, ``fenced``, ``rejected``, ``data_loss`` or
    ``mirror_failed``. Best effort, like :func:`record_batch`."""
    return record_many(store, [failure_record(job, outcome)])


def load_stats(conn: sa.Connection, db: DatabaseSettings) -> dict[str, JobStats]:
    """Every job's statistics (a plain SELECT: no row locks)."""
    t = tables_for(db.schema).stats
    out = {}
    for row in conn.execute(sa.select(t).order_by(t.c.job)):
        counts = {name: int(getattr(row, name)) for name in STAT_OUTCOMES}
        out[row.job] = JobStats(
            row.job,
            int(row.batches),
            float(row.batch_seconds_sum),
            tuple(int(b or 0) for b in row.batch_buckets),
            counts,
        )
    return out
