"""One consistent picture of the store for a scrape: jobs, stored offsets, statistics, Kafka facts.

The database part is plain SELECTs in one READ ONLY transaction (a snapshot of all three tables),
with lock and statement timeouts of a few seconds set for that transaction only: a scrape never
takes a row lock, so it can never make a claim, a new run or a reset wait, and a stuck database
costs a scrape seconds. The Kafka part comes from :class:`~txn_offsets.service.kafka_view.KafkaView`
(cached for a few seconds).

Set-based, for many partitions: the stored offsets come as one row per (job, topic) holding three
arrays (partitions, offsets, ages; the retired jobs left out by the database), not a row per
partition; each job's lag is computed over its own topics' partitions only (not every partition
Kafka answered for). At 32 jobs x 4,096 partitions: docs/operations.md#the-console.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by

from txn_offsets.admin.lag import PartitionLag, partition_lags
from txn_offsets.admin.views import is_retired
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.ranges import TopicPartition
from txn_offsets.service.kafka_view import KafkaFacts, KafkaView
from txn_offsets.store import health
from txn_offsets.store.handle import Store
from txn_offsets.store.health import TableStats
from txn_offsets.store.stats import JobStats, load_stats

__all__ = ["JobView", "Snapshot", "read_snapshot"]

logger = logging.getLogger(__name__)

_SKEW_S = 1.0  # ages of the database's clock and ours compared: a second of slack

_TIMEOUTS = sa.select(
    sa.func.set_config("statement_timeout", "5s", True),
    sa.func.set_config("lock_timeout", "1s", True),
)


class StoredRow(NamedTuple):
    offset: int
    last_commit_age_s: float  # since the row last moved (a commit, seed, skip or reset)


@dataclass(frozen=True)
class JobView:
    job: str
    generation: int
    run_id: str | None
    live: bool
    heartbeat_age_s: float | None
    stored: dict[TopicPartition, StoredRow]
    partitions: tuple[PartitionLag, ...]  # where Kafka answered: lag in offsets and seconds
    stats: JobStats | None
    # the job's topics Kafka gave no facts for while it answered: topic -> why (a topic of one
    # job never takes the others' series with it)
    topic_errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def as_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "generation": self.generation,
            "state": "live" if self.live else "idle",
            "run_id": self.run_id,
            "heartbeat_age_s": self.heartbeat_age_s,
            "total_lag": self.total_lag,
            "partitions": [
                {
                    **p.as_dict(),
                    "last_commit_age_s": (
                        self.stored[(p.topic, p.partition)].last_commit_age_s
                        if (p.topic, p.partition) in self.stored
                        else None
                    ),
                }
                for p in self.partitions
            ],
            "without_kafka_facts": [
                {"topic": t, "partition": p, "offset": row.offset}
                for (t, p), row in sorted(self.stored.items())
                if not any((x.topic, x.partition) == (t, p) for x in self.partitions)
            ],
            "topic_errors": dict(sorted(self.topic_errors.items())),
        }

    @property
    def topics(self) -> list[str]:
        """The topics of the job's stored rows, sorted."""
        return sorted({t for t, _ in self.stored})


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[JobView, ...] = ()
    database_error: str | None = None
    kafka: KafkaFacts | None = None
    stats_error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    store: StoreHealth | None = None
    retired: tuple[str, ...] = ()  # jobs retired by `jobs retire` (not started since): not shown


@dataclass(frozen=True)
class StoreHealth:
    """The offsets table's update counters and size, and the oldest open transaction's age."""

    offsets: TableStats
    oldest_transaction_s: float


def _offsets_query(store: Store) -> sa.Select[Any]:
    """The stored offsets of every job not retired: one row per (job, topic) with its partitions,
    their offsets and ages (seconds since each row moved, as a double), in partition order."""
    t = store.tables
    j, o = t.jobs, t.offsets
    age = sa.cast(sa.extract("epoch", sa.func.now() - o.c.updated_at), sa.Double)

    def by_part(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        return sa.func.array_agg(aggregate_order_by(column, o.c.part))

    return (
        sa.select(o.c.job, o.c.topic, by_part(o.c.part), by_part(o.c.off), by_part(age))
        .join(j, j.c.job == o.c.job)
        .where(sa.not_(is_retired(j)))
        .group_by(o.c.job, o.c.topic)
    )


def _read_db(
    store: Store,
) -> tuple[
    list[sa.Row[tuple[object, ...]]],
    dict[str, dict[TopicPartition, StoredRow]],
    dict[str, JobStats],
    str | None,
    StoreHealth,
    list[str],
]:
    j = store.tables.jobs
    jobs_q = sa.select(
        j.c.job,
        j.c.generation,
        j.c.run_id,
        sa.and_(j.c.run_id.is_not(None), j.c.lease_until > sa.func.now()).label("live"),
        sa.extract("epoch", sa.func.now() - j.c.heartbeat_at).label("age"),
        is_retired(j).label("retired"),
    ).order_by(j.c.job)
    stored: dict[str, dict[TopicPartition, StoredRow]] = {}
    stats: dict[str, JobStats] = {}
    stats_error = None
    with store.connect() as conn, conn.begin():
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        conn.execute(_TIMEOUTS)
        every = list(conn.execute(jobs_q))
        # a retired job gives no series: its lag, STOPPED, would page through the shipped rules
        retired = [r.job for r in every if r.retired]
        jobs = [r for r in every if not r.retired]
        for job, topic, parts, offsets, ages in conn.execute(_offsets_query(store)):
            mine = stored.setdefault(job, {})
            for part, offset, age in zip(parts, offsets, ages, strict=True):
                mine[(topic, part)] = StoredRow(offset, age if age > 0.0 else 0.0)
        try:
            with conn.begin_nested():
                stats = load_stats(conn, store.settings)
        except sa.exc.ProgrammingError:  # job_stats missing: the schema is older than 0004
            stats_error = "job_stats table missing: run `txn-offsets db upgrade`"
        found = StoreHealth(
            health.offsets_table_stats(conn, store.settings), health.oldest_transaction_age_s(conn)
        )
    return jobs, stored, stats, stats_error, found, retired


def _proven_marks(
    facts: KafkaFacts, stored: dict[str, dict[TopicPartition, StoredRow]], read_at: float
) -> dict[TopicPartition, tuple[int, int]]:
    """The (log start, end) per partition; from cached facts (fetched before the offsets were read
    at `read_at`), each end raised to the stored offsets that moved after the fetch: a job read up
    to there, so the end was at least that far. Cached facts are up to `ttl_s` old while the
    offsets are read fresh: without this, a job that commits records produced since the last
    refresh would look past the end (out of the log) until the next refresh. An offset past the
    end that moved before the fetch, or past facts fetched after the read, stays past it."""
    marks = dict(facts.marks)
    if facts.fetched_at >= read_at:
        return marks
    facts_age = read_at - facts.fetched_at + _SKEW_S
    for rows in stored.values():
        for key, row in rows.items():
            if key in marks and row.offset > marks[key][1] and row.last_commit_age_s < facts_age:
                marks[key] = (marks[key][0], row.offset)
    return marks


def read_snapshot(store: Store, kafka: KafkaView | None) -> Snapshot:
    """Everything /metrics and /offsets show. Never raises for an unreachable service: the
    snapshot says what could not be read (``database_error``, ``kafka.error``)."""
    read_at = time.time()
    try:
        jobs, stored, stats, stats_error, store_health, retired = _read_db(store)
    except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
        detail = str(exc) if isinstance(exc, TxnOffsetsError) else type(exc).__name__
        logger.warning("scrape: database not read: %s", detail)
        return Snapshot(database_error=detail)
    every: dict[TopicPartition, set[int]] = {}
    for rows in stored.values():
        for key, row in rows.items():
            every.setdefault(key, set()).add(row.offset)
    facts = kafka.facts(every) if kafka is not None and every else None
    marks = _proven_marks(facts, stored, read_at) if facts is not None and facts.error is None else {}
    views = []
    for r in jobs:
        mine = stored.get(r.job, {})
        lags: tuple[PartitionLag, ...] = ()
        errors: dict[str, str] = {}
        if facts is not None and facts.error is None:
            topics = {t for t, _ in mine}
            errors = {t: facts.topic_errors[t] for t in topics if t in facts.topic_errors}
            offsets = {k: row.offset for k, row in mine.items()}
            # the first record's timestamp at each position of the job's own partitions (stored,
            # or Kafka's of its topics): partition_lags asks for no other
            own = set(offsets)
            for t in topics:
                own.update((t, p) for p in facts.partitions.get(t, ()))
            timestamps = facts.timestamps
            own_ts = {}
            for key in own:
                known = marks.get(key)
                if known is not None:
                    lo = known[0]
                    at = offsets.get(key, lo)
                    own_ts[key] = timestamps.get((key[0], key[1], at if at > lo else lo))
            lags = partition_lags(offsets, facts.partitions, marks, own_ts)
        age = None if r.age is None else float(r.age)
        views.append(
            JobView(r.job, r.generation, r.run_id, bool(r.live), age, mine, lags, stats.get(r.job), errors)
        )
    return Snapshot(tuple(views), None, facts, stats_error, store=store_health, retired=tuple(retired))
