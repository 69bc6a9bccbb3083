"""``make bench``: what exactly-once costs, measured against its peers in the same run.

One data set (page views from examples/pageviews.py, 8 partitions) is processed by three jobs that
produce the same window counts, each on the same local Spark session:

* ``txn_offsets``      - examples/windowed_counts.py: claim + additive upsert + offset, one transaction
                         per range (exactly once);
* ``no_offsets``       - the same read, aggregate and upsert, in a transaction per range but without
                         the claim or any offset (at-least-once: what a plain job does);
* ``per_record_rows``  - examples/idempotent_events.py: one row per record keyed by its coordinates
                         (effectively once, but it stores every record).

Every variant's result is checked against the oracle before its time counts. Prints one table of
seconds, records/s and the ratio to ``txn_offsets``. Knobs: BENCH_MESSAGES (default 500,000),
BENCH_REPEAT (default 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from examples import idempotent_events, pageviews, windowed_counts
from examples import migrate as examples_migrate
from examples.schema import events, window_counts
from txn_offsets import Limits, StartPolicy, from_env, local_session, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.kafka.reader import read_range
from txn_offsets.ranges import OffsetRange, plan_ranges
from txn_offsets.spark.executor import worker_engine
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for

PARTITIONS = 8
PER_PARTITION = 50_000


def _windows(engine: sa.Engine, topic: str) -> dict[tuple[int, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(window_counts.c.window_start, window_counts.c.page, window_counts.c.views).where(
                window_counts.c.topic == topic
            )
        ).all()
    return {(int(r.window_start.timestamp() * 1000), r.page): r.views for r in rows}


def _no_offsets_task(
    db: DatabaseSettings, kafka: KafkaSettings, ranges: list[OffsetRange]
) -> Callable[..., Any]:
    def task(index: int, placeholder: Iterator[Any]) -> Iterator[int]:
        for _ in placeholder:
            pass
        rng = ranges[index]
        partials = windowed_counts.aggregate(pageviews.decode(r) for r in read_range(kafka, rng))
        # the same per-worker engine the library uses: only the protocol differs between variants
        with worker_engine(db).begin() as conn:
            windowed_counts.write(conn, rng, partials)
        yield sum(v[0] for v in partials.values())

    return task


def run_no_offsets(spark: Any, db: DatabaseSettings, kafka: KafkaSettings, topic: str) -> int:
    """Plain at-least-once: same ranges, same writes, no claim and no stored offsets."""
    ends = {tp: end for tp, (_, end) in watermarks(kafka, [(topic, p) for p in range(PARTITIONS)]).items()}
    position = dict.fromkeys(ends, 0)
    total = 0
    while True:
        ranges = plan_ranges(position, ends, max_per_partition=PER_PARTITION)
        if not ranges:
            return total
        rdd = spark.sparkContext.parallelize(range(len(ranges)), len(ranges))
        total += sum(rdd.mapPartitionsWithIndex(_no_offsets_task(db, kafka, ranges)).collect())
        position.update({r.key: r.until for r in ranges})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=int(os.environ.get("BENCH_MESSAGES", "500000")))
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEAT", "1")))
    args = parser.parse_args()
    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=f"bench_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(db)
    examples_migrate.upgrade(db)
    engine = engine_for(db)
    spark = local_session("txn-offsets-bench", master="local[2]")
    results: dict[str, list[float]] = {}
    # warm up the JVM and the Python workers so the first variant does not pay for them
    spark.sparkContext.parallelize(range(1000), 2).map(lambda x: x + 1).sum()
    try:
        for rep in range(args.repeat):
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            admin = AdminClient(kafka.client_config())
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
            oracle = pageviews.produce(
                kafka.bootstrap_servers, topic, args.messages, partitions=PARTITIONS, abort_every=0
            )
            expected = dict(oracle.windows)
            variants: dict[str, Callable[[str], None]] = {
                "txn_offsets": lambda t: _check(
                    run_job(
                        spark,
                        job=f"b-{t}",
                        kafka=kafka,
                        database=db,
                        writer=windowed_counts.WRITER,
                        topics=[t],
                        start=StartPolicy.earliest(),
                        limits=Limits(max_records_per_partition=PER_PARTITION),
                        until_caught_up=True,
                    ).records,
                    args.messages,
                ),
                "no_offsets": lambda t: _check(run_no_offsets(spark, db, kafka, t), args.messages),
                "per_record_rows": lambda t: _check(
                    run_job(
                        spark,
                        job=f"e-{t}",
                        kafka=kafka,
                        database=db,
                        writer=idempotent_events.WRITER,
                        topics=[t],
                        start=StartPolicy.earliest(),
                        limits=Limits(max_records_per_partition=PER_PARTITION),
                        until_caught_up=True,
                    ).records,
                    args.messages,
                ),
            }
            for name, run in variants.items():
                _clear(engine, topic)
                t0 = time.perf_counter()
                run(topic)
                seconds = time.perf_counter() - t0
                if name != "per_record_rows" and _windows(engine, topic) != expected:
                    raise SystemExit(f"bench: {name} produced wrong window counts")
                results.setdefault(name, []).append(seconds)
                print(f"bench: run {rep + 1} {name:16} {seconds:7.2f}s", flush=True)
            _clear(engine, topic)
    finally:
        spark.stop()
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{db.schema}" CASCADE'))
        engine.dispose()
    base = min(results["txn_offsets"])
    setup = f"{args.messages:,} page views, {PARTITIONS} partitions, Spark local[2]"
    print(f"\nbench: {setup}, best of {args.repeat}")
    print(f"  {'variant':16} {'seconds':>8} {'records/s':>11} {'time vs txn_offsets':>20}")
    for name, times in results.items():
        best = min(times)
        print(f"  {name:16} {best:8.2f} {args.messages / best:11,.0f} {best / base:19.2f}x")
    return 0


def _check(records: int, expected: int) -> None:
    if records != expected:
        raise SystemExit(f"bench: a variant read {records} records, expected {expected}")


def _clear(engine: sa.Engine, topic: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(window_counts).where(window_counts.c.topic == topic))
        conn.execute(sa.delete(events).where(events.c.topic == topic))


if __name__ == "__main__":
    sys.exit(main())
