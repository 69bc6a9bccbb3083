"""The snapshot's read before the set-based rewrite (txn_offsets/service/snapshot.py and
admin/lag.py's partition_lags as of commit b58c887), kept as the contender of
:mod:`benchmarks.console`'s before/after figure and as the reference of
tests/integration/service/test_snapshot_same.py (the same store state, the same answer).
Not used by the product."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import sqlalchemy as sa

from txn_offsets.admin.lag import PartitionLag
from txn_offsets.admin.views import is_retired
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.ranges import TopicPartition
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.snapshot import (
    _TIMEOUTS,
    JobView,
    Snapshot,
    StoredRow,
    StoreHealth,
    _proven_marks,
)
from txn_offsets.store import health
from txn_offsets.store.handle import Store
from txn_offsets.store.stats import JobStats, load_stats

__all__ = ["read_snapshot_before"]

logger = logging.getLogger(__name__)


def _partition_lags(
    stored: Mapping[TopicPartition, int],
    partitions: Mapping[str, tuple[int, ...]],
    marks: Mapping[TopicPartition, tuple[int, int]],
    timestamps: Mapping[TopicPartition, int | None] | None = None,
) -> tuple[PartitionLag, ...]:
    now = time.time()
    keys = set(stored)
    for topic in {t for t, _ in stored}:
        keys.update((topic, p) for p in partitions.get(topic, ()))
    rows = []
    for key in sorted(k for k in keys if k in marks):
        start, end = marks[key]
        row = PartitionLag(key[0], key[1], stored.get(key), start, end)
        seconds: float | None = 0.0
        if row.lag > 0:
            ts = (timestamps or {}).get(key)
            seconds = None if ts is None else max(0.0, now - ts / 1000.0)
        rows.append(PartitionLag(key[0], key[1], row.offset, start, end, seconds))
    return tuple(rows)


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
    t = store.tables
    j, o = t.jobs, t.offsets
    jobs_q = sa.select(
        j.c.job,
        j.c.generation,
        j.c.run_id,
        sa.and_(j.c.run_id.is_not(None), j.c.lease_until > sa.func.now()).label("live"),
        sa.extract("epoch", sa.func.now() - j.c.heartbeat_at).label("age"),
        is_retired(j).label("retired"),
    ).order_by(j.c.job)
    offsets_q = sa.select(
        o.c.job,
        o.c.topic,
        o.c.part,
        o.c.off,
        sa.extract("epoch", sa.func.now() - o.c.updated_at).label("age"),
    ).order_by(o.c.job, o.c.topic, o.c.part)
    stored: dict[str, dict[TopicPartition, StoredRow]] = {}
    stats: dict[str, JobStats] = {}
    stats_error = None
    with store.connect() as conn, conn.begin():
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        conn.execute(_TIMEOUTS)
        every = list(conn.execute(jobs_q))
        retired = [r.job for r in every if r.retired]
        jobs = [r for r in every if not r.retired]
        for r in conn.execute(offsets_q):
            if r.job not in retired:
                stored.setdefault(r.job, {})[(r.topic, r.part)] = StoredRow(r.off, max(0.0, float(r.age)))
        try:
            with conn.begin_nested():
                stats = load_stats(conn, store.settings)
        except sa.exc.ProgrammingError:
            stats_error = "job_stats table missing: run `txn-offsets db upgrade`"
        found = StoreHealth(
            health.offsets_table_stats(conn, store.settings), health.oldest_transaction_age_s(conn)
        )
    return jobs, stored, stats, stats_error, found, retired


def read_snapshot_before(store: Store, kafka: KafkaView | None) -> Snapshot:
    """:func:`txn_offsets.service.snapshot.read_snapshot` as it was (see the module)."""
    read_at = time.time()
    try:
        jobs, stored, stats, stats_error, store_health, retired = _read_db(store)
    except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
        detail = str(exc) if isinstance(exc, TxnOffsetsError) else type(exc).__name__
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
            errors = {t: facts.topic_errors[t] for t, _ in mine if t in facts.topic_errors}
            offsets = {k: row.offset for k, row in mine.items()}
            own_ts = {
                (t, p): facts.timestamps.get((t, p, max(offsets.get((t, p), lo), lo)))
                for (t, p), (lo, _end) in marks.items()
            }
            lags = _partition_lags(offsets, facts.partitions, marks, own_ts)
        age = None if r.age is None else float(r.age)
        views.append(
            JobView(r.job, r.generation, r.run_id, bool(r.live), age, mine, lags, stats.get(r.job), errors)
        )
    return Snapshot(tuple(views), None, facts, stats_error, store=store_health, retired=tuple(retired))
