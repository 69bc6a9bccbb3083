"""A job written as the README writes one, timed per batch on topics whose records fill every partition.

The job: ``PartitionWriter(write=..., decode=lambda rec: 1, aggregate=sum)`` with an ``upsert_add``
per range (or ``write_all``: one upsert per transaction), ``Limits(max_records_per_batch=...)``, over
a topic whose records are spread round-robin over all of its partitions, so that each batch at N
partitions carries ~min(N, batch records) ranges (the page-view topics of the sweep, keyed by a
skewed user, fill only a few hundred partitions per batch). :func:`run` times one job's batches
(from one batch's commit to the next; the first batch, which also holds run_job's start, is left
out); ``python -m benchmarks.user_scale`` alternates the partition counts in one Spark application
and prints each run's per-batch p50 and ranges per batch (the reproduction of issue 46), and the
CPU each process of the run used a batch (:func:`benchmarks.resources.cpu_by_role`: the driver, the
Spark JVM, the Python workers and the local stack's services).
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Producer

from benchmarks import pg_statements, resources
from benchmarks.dataset import create_topic, delete_topics
from benchmarks.stats import percentile
from examples.pageviews import unconfirmed
from txn_offsets import BatchReport, Limits, PartitionWriter, StartPolicy, run_job, upsert_add
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange

SCHEMA = "bench_user"
TABLE = sa.Table(
    "counts",
    sa.MetaData(schema=SCHEMA),
    sa.Column("topic", sa.Text, primary_key=True),
    sa.Column("part", sa.Integer, primary_key=True),
    sa.Column("n", sa.BigInteger),
)


@dataclass(frozen=True)
class SpreadTopic:
    """A topic of `records` records, round-robin over its `partitions` (each ~records/partitions)."""

    topic: str
    partitions: int
    records: int


def produce_spread(kafka: KafkaSettings, partitions: int, records: int) -> SpreadTopic:
    topic = create_topic(kafka, partitions, prefix="bench-spread")
    producer = Producer(kafka.client_config() | {"linger.ms": 20, "batch.num.messages": 10_000})
    delivered: list[tuple[Any, int | None]] = []
    for i in range(records):
        while True:
            try:
                producer.produce(
                    topic,
                    value=b"1",
                    partition=i % partitions,
                    on_delivery=lambda err, msg: delivered.append((err, msg.offset())),
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    # a busy broker takes minutes for 4,096 partitions (a fresh stack's at 22:40 UTC: over 120 s)
    left = producer.flush(600)
    if left:
        raise RuntimeError(f"{topic}: {left} records left undelivered after 600 s")
    why = unconfirmed(delivered, records)  # the exactness check would blame the job
    if why is not None:
        raise RuntimeError(f"{topic}: the records' delivery is not confirmed: {why}")
    return SpreadTopic(topic, partitions, records)


def create_table(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        TABLE.create(conn, checkfirst=True)


def _one(_record: Any) -> int:
    return 1


def _write(conn: sa.Connection, rng: OffsetRange, n: int) -> None:  # the README's shape: per range
    upsert_add(
        conn, TABLE, [{"topic": rng.topic, "part": rng.partition, "n": n}], keys=["topic", "part"], add=["n"]
    )


def _write_all(conn: sa.Connection, items: Sequence[tuple[OffsetRange, int]]) -> None:
    rows = [{"topic": r.topic, "part": r.partition, "n": n} for r, n in items]
    upsert_add(conn, TABLE, rows, keys=["topic", "part"], add=["n"])


WRITE: PartitionWriter[int, int] = PartitionWriter(write=_write, decode=_one, aggregate=sum)
WRITE_ALL: PartitionWriter[int, int] = PartitionWriter(write_all=_write_all, decode=_one, aggregate=sum)
WRITERS = {"write": WRITE, "write_all": WRITE_ALL}


def run(
    spark: Any,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    data: SpreadTopic,
    *,
    batch_records: int,
    mode: str = "write",
) -> dict[str, Any]:
    """One job over the whole topic: its batches' intervals, ranges and records, checked exact."""
    from txn_offsets.store.database import engine_for

    engine = engine_for(db)
    try:
        with engine.begin() as conn:
            conn.execute(TABLE.delete().where(TABLE.c.topic == data.topic))
        commits: list[float] = []
        reports: list[BatchReport] = []

        services = resources.stack_services()
        cpu0: dict[str, float] = {}
        pg0: dict[str, float] = {}

        def committed(report: BatchReport) -> None:
            commits.append(time.perf_counter())
            reports.append(report)
            if len(reports) == 1:  # the CPU of the batches timed: from the first one's commit
                cpu0.update(resources.cpu_by_role(services))
                pg0.update(pg_statements.snapshot(engine) or {})

        t0 = time.perf_counter()
        summary = run_job(
            spark,
            job=f"bench-user-{uuid.uuid4().hex[:8]}",
            kafka=kafka,
            database=db,
            writer=WRITERS[mode],
            topics=[data.topic],
            start=StartPolicy.earliest(),
            limits=Limits(max_records_per_batch=batch_records),
            until_caught_up=True,
            batch_interval_s=0.0,
            on_batch=committed,
        )
        seconds = time.perf_counter() - t0
        cpu = resources.used(cpu0, resources.cpu_by_role(services)) if cpu0 else {}
        pg_after = pg_statements.snapshot(engine) if pg0 else None
        pg = pg_statements.used(pg0, pg_after) if pg_after is not None else {}
        with engine.connect() as conn:
            total, parts = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(TABLE.c.n), 0), sa.func.count()).where(
                    TABLE.c.topic == data.topic
                )
            ).one()
        with engine.begin() as conn:
            conn.execute(TABLE.delete().where(TABLE.c.topic == data.topic))
    finally:
        engine.dispose()
    exact = int(total) == data.records == summary.records and int(parts) == min(data.partitions, data.records)
    if not exact:
        raise RuntimeError(
            f"user scale p{data.partitions} {mode}: summed {total} over {parts} partitions, counted "
            f"{summary.records}; the topic has {data.records} records"
        )
    intervals = [b - a for a, b in itertools.pairwise(commits)]
    later = reports[1:]
    return {
        "partitions": data.partitions,
        "mode": mode,
        "seconds": seconds,
        "records": summary.records,
        "batches": len(reports),
        "interval_p50_s": percentile(intervals, 50),
        "job_p50_s": percentile([r.seconds for r in later], 50),
        "ranges_p50": percentile([r.ranges for r in later], 50),
        "records_p50": percentile([r.records for r in later], 50),
        # each role's CPU a batch over the batches timed (after the first, which holds the run's
        # start), in ms: the driver, the Spark JVM, the Python workers, the stack's services
        "cpu_ms_per_batch": {role: 1000 * s / max(1, len(later)) for role, s in cpu.items()},
        # PostgreSQL's time a batch by kind of statement (benchmarks/pg_statements.py), in ms: empty
        # when the server does not keep pg_stat_statements
        "pg_ms_per_batch": {name: ms / max(1, len(later)) for name, ms in pg.items()},
    }


def cpu_line(cpu_ms_per_batch: Mapping[str, float]) -> str:
    """``cpu/batch 612 ms: postgres 240, python_workers 225, ...`` (largest first, roles of 0 left
    out)."""
    return _ms_line("cpu/batch", cpu_ms_per_batch)


def costs_line(run: Mapping[str, Any]) -> str:
    """A run's :func:`cpu_line`, then PostgreSQL's time a batch by kind of statement when the
    server keeps it (``pg/batch 150 ms: claim 82, write: merge 40, ...``)."""
    line = cpu_line(run["cpu_ms_per_batch"])
    if run.get("pg_ms_per_batch"):
        line += "; " + _ms_line("pg/batch", run["pg_ms_per_batch"])
    return line


def _ms_line(title: str, ms_by_name: Mapping[str, float]) -> str:
    shown = sorted(((ms, name) for name, ms in ms_by_name.items() if ms >= 0.5), reverse=True)
    total = sum(ms for ms, _ in shown)
    return f"{title} {total:.0f} ms: " + ", ".join(f"{name} {ms:.0f}" for ms, name in shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,1024,4096")
    parser.add_argument("--records", type=int, default=64_000)
    parser.add_argument("--batch-records", type=int, default=8_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="write,write_all")
    args = parser.parse_args()
    from txn_offsets import from_env, local_session

    db, kafka = from_env()
    db = DatabaseSettings(os.environ.get("TXN_OFFSETS_OWNER_DATABASE_URL", db.url), schema=db.schema)
    from txn_offsets.store.database import engine_for

    engine = engine_for(db)
    create_table(engine)
    engine.dispose()
    counts = [int(p) for p in args.partitions.split(",")]
    topics = {n: produce_spread(kafka, n, args.records) for n in counts}
    spark = local_session("bench-user-scale", master="local[2]")
    try:
        for mode in args.modes.split(","):
            ratios = []
            for round_ in range(args.rounds + 1):  # round 0: first runs (warming)
                order = counts if round_ % 2 == 0 else counts[::-1]
                p50 = {}
                for n in order:
                    r = run(spark, db, kafka, topics[n], batch_records=args.batch_records, mode=mode)
                    p50[n] = r["interval_p50_s"]
                    print(
                        f"user-scale {mode:9} round {round_} p{n:<5} {r['seconds']:6.2f}s "
                        f"batches {r['batches']:2d} "
                        f"ranges/batch {r['ranges_p50']:.0f} per-batch p50 {r['interval_p50_s']:.3f}s "
                        f"(job {r['job_p50_s']:.3f}s); {costs_line(r)}",
                        flush=True,
                    )
                ratio = p50[max(counts)] / p50[min(counts)]
                ratios.append(ratio)
                print(
                    f"user-scale {mode:9} round {round_} p{max(counts)} / p{min(counts)} {ratio:.1f}",
                    flush=True,
                )
            warm = sorted(ratios[1:]) or ratios
            print(
                f"user-scale {mode:9} warm rounds' ratio median {warm[len(warm) // 2]:.1f} (all: "
                f"{', '.join(f'{x:.1f}' for x in ratios)})",
                flush=True,
            )
    finally:
        spark.stop()
        delete_topics(kafka, [t.topic for t in topics.values()])


if __name__ == "__main__":
    main()
