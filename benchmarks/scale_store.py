"""The scale phase's measures of the offset store alone (no Spark): how long a plan takes at many
partitions, and how the offsets table holds up under many batches of claims (HOT updates, size).

Both are small local functions on purpose: :func:`plan_times` and :func:`claims_hot` are the two
measures the store's own scale work may provide helpers for; the bench only needs their numbers.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for
from txn_offsets.store.offset_rows import seed_offsets
from txn_offsets.store.runs import end_run, start_run
from txn_offsets.store.transaction import commit_ranges


def plan_times(db: DatabaseSettings, kafka: KafkaSettings, topic: str, plans: int) -> dict[str, Any]:
    """A fresh job on `topic`: its first plan (which seeds a row per partition) timed apart, then
    `plans` more plans of the same run (the steady state: lease renewal, rows loaded, Kafka's
    metadata and end offsets listed, ranges computed; nothing committed in between)."""
    job = f"bench-plan-{uuid.uuid4().hex[:8]}"
    engine = engine_for(db)
    try:
        run = start_run(engine, db, job, lease_s=600)
        times = []
        ranges = 0
        for _ in range(plans + 1):
            t0 = time.perf_counter()
            plan = plan_batch(
                engine,
                db,
                kafka,
                job=job,
                selection=TopicSelection((topic,)),
                start=StartPolicy.earliest(),
                limits=Limits(max_records_per_batch=8_000),
                run=run,
            )
            times.append((time.perf_counter() - t0) * 1000)
            ranges = len(plan.ranges)
        end_run(engine, db, run)
    finally:
        engine.dispose()
    steady = times[1:]
    return {
        "plans": plans,
        "first_ms": times[0],
        "p50_ms": statistics.median(steady),
        "max_ms": max(steady),
        "ranges": ranges,
        "partitions": len(plan.stored),
    }


def claims_hot(db_url: str, partitions: int, checkpoints: tuple[int, ...]) -> dict[str, Any]:
    """A job of `partitions` rows in a schema of its own; batches of claims, each batch one
    transaction that advances every partition by 1 (commit_ranges: the guarded claims, the lineage
    rows); after each checkpoint's number of batches, the offsets table's HOT-update ratio (from
    pg_stat_user_tables) and size (heap + indexes)."""
    db = DatabaseSettings(db_url, schema=f"bench_hot_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(db)
    topic = "hot"
    job = f"bench-hot-{uuid.uuid4().hex[:8]}"
    engine = engine_for(db)
    out: dict[str, Any] = {"partitions": partitions, "at": {}}
    try:
        run = start_run(engine, db, job, lease_s=3600)
        with engine.begin() as conn:
            seed_offsets(
                conn,
                db,
                job,
                dict.fromkeys(((topic, p) for p in range(partitions)), 0),
                reason="bench",
                actor="bench",
                generation=run.generation,
            )
        done = 0
        t0 = time.perf_counter()
        for target in sorted(checkpoints):
            while done < target:
                ranges = [OffsetRange(topic, p, done, done + 1) for p in range(partitions)]
                commit_ranges(engine, db, run, ranges)
                done += 1
            engine.dispose()  # the backends flush their table statistics as they exit
            seconds = time.perf_counter() - t0
            out["at"][str(target)] = {**_table_stats(db, done * partitions), "seconds": seconds}
        end_run(engine, db, run)
    finally:
        engine.dispose()
        with engine_for(db).begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{db.schema}" CASCADE'))
    first, last = (out["at"][str(n)] for n in (min(checkpoints), max(checkpoints)))
    out["hot_ratio"] = last["hot_ratio"]
    out["size_growth"] = last["total_bytes"] / first["total_bytes"] if first["total_bytes"] else None
    return out


def _table_stats(db: DatabaseSettings, updates: int) -> dict[str, Any]:
    engine = engine_for(db)
    try:
        deadline = time.monotonic() + 5
        with engine.connect() as conn:
            while True:  # the exiting backends' statistics arrive within moments
                conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
                row = conn.execute(
                    sa.text(
                        "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, "
                        "pg_relation_size(relid) AS heap, pg_total_relation_size(relid) AS total "
                        "FROM pg_stat_user_tables WHERE schemaname = :s AND relname = 'offsets'"
                    ),
                    {"s": db.schema},
                ).one()
                if row.n_tup_upd >= updates or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    finally:
        engine.dispose()
    return {
        "updates": row.n_tup_upd,
        "hot_updates": row.n_tup_hot_upd,
        "hot_ratio": row.n_tup_hot_upd / row.n_tup_upd if row.n_tup_upd else None,
        "dead_tuples": row.n_dead_tup,
        "live_tuples": row.n_live_tup,
        "heap_bytes": row.heap,
        "total_bytes": row.total,
    }
