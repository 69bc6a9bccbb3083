"""The demo behind ``make demo``: a million page views, counted per 1-minute window and page,
exactly once, then verified against the data that was produced.

Steps: migrate the offsets schema and the examples' tables as the database's owner and grant them
to the role the job runs as (:func:`examples.migrate.prepare`: the local stack's run role); create a
fresh 8-partition topic; produce the page views in Kafka transactions (every 10th aborted: those
must never be counted); run ``windowed_counts`` to completion on local Spark with a progress display
(``--connect``: as a Spark Connect client of a local Connect server, on the DataFrame execution
path); print the busiest windows; compare every (window, page) total and the stored offsets with the
oracle. The last line is ``demo: messages=<N> batches=<B> seconds=<S> verified=ok`` (or
``verified=FAILED ...``, exit 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from examples import migrate as examples_migrate
from examples import pageviews
from examples.schema import window_counts
from examples.windowed_counts import WRITER
from txn_offsets import BatchReport, Limits, StartPolicy, from_env, local_session, run_job
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.spark.session import connect_client
from txn_offsets.store.database import engine_for
from txn_offsets.store.offset_rows import load_offsets

PARTITIONS = 8


def verify(
    engine: sa.Engine, db: object, kafka: object, *, job: str, topic: str, oracle: pageviews.Oracle
) -> str:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                window_counts.c.window_start,
                window_counts.c.page,
                window_counts.c.views,
                window_counts.c.duration_ms,
            ).where(window_counts.c.topic == topic)
        ).all()
        stored = load_offsets(conn, db, job)  # type: ignore[arg-type]
    views = {(int(r.window_start.timestamp() * 1000), r.page): r.views for r in rows}
    durations = {(int(r.window_start.timestamp() * 1000), r.page): r.duration_ms for r in rows}
    problems = []
    if views != dict(oracle.windows):
        wrong = sum(1 for k in set(views) | set(oracle.windows) if views.get(k) != oracle.windows.get(k))
        problems.append(
            f"views differ in {wrong} (window, page) cells: stored={sum(views.values())} "
            f"expected={oracle.messages}"
        )
    if durations != dict(oracle.durations):
        problems.append("duration sums differ")
    ends = {tp: end for tp, (_, end) in watermarks(kafka, [(topic, p) for p in range(PARTITIONS)]).items()}  # type: ignore[arg-type]
    if stored != ends:
        problems.append(f"stored offsets {stored} != end offsets {ends}")
    return "ok" if not problems else "FAILED " + "; ".join(problems)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="committed page views to produce")
    parser.add_argument(
        "--max-per-partition", type=int, default=40_000, help="records per partition per batch"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--connect",
        action="store_true",
        help="run the job through Spark Connect (a local Connect server on --master; no RDD API)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    db, kafka = from_env()  # the role the job runs as: the local stack's run role
    examples_migrate.prepare(db)
    suffix = uuid.uuid4().hex[:8]
    topic, job = f"pageviews-{suffix}", f"demo-{suffix}"
    admin = AdminClient(kafka.client_config())
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    print(
        f"demo: producing {args.messages:,} page views to {topic} ({PARTITIONS} partitions, every 10th "
        f"transaction aborted)"
    )
    t0 = time.monotonic()
    oracle = pageviews.produce(
        kafka.bootstrap_servers,
        topic,
        args.messages,
        partitions=PARTITIONS,
        progress=lambda n: (
            print(f"\r  produced {n:,}/{args.messages:,}", end="", flush=True)
            if sys.stdout.isatty()
            else None
        ),
    )
    print(
        f"\r  produced {oracle.messages:,} committed + {oracle.aborted:,} aborted in "
        f"{time.monotonic() - t0:.1f}s"
    )

    server = local_session("txn-offsets-demo", master=args.master, serve_connect=args.connect)
    spark = connect_client(server) if args.connect else server
    t1 = time.monotonic()
    done = 0

    def progress(report: BatchReport) -> None:
        nonlocal done
        done += report.records
        rate = done / max(1e-9, time.monotonic() - t1)
        print(
            f"  batch {report.number:3}: {done:>10,}/{oracle.messages:,} records  {rate:>9,.0f} rec/s  "
            f"lag {report.lag:,}",
            flush=True,
        )

    how = "through Spark Connect on a local server" if args.connect else "on Spark"
    print(f"demo: running windowed_counts (job {job}) {how} {args.master}")
    try:
        summary = run_job(
            spark,
            job=job,
            kafka=kafka,
            database=db,
            writer=WRITER,
            topics=[topic],
            start=StartPolicy.earliest(),
            limits=Limits(max_records_per_partition=args.max_per_partition),
            until_caught_up=True,
            on_batch=progress,
        )
    finally:
        if spark is not server:
            spark.stop()  # the Connect session; then the server's own session
        server.stop()
    engine = engine_for(db)
    with engine.connect() as conn:
        top = conn.execute(
            sa.select(window_counts)
            .where(window_counts.c.topic == topic)
            .order_by(window_counts.c.views.desc(), window_counts.c.window_start)
            .limit(8)
        ).all()
    print("demo: busiest (window, page) cells")
    print(f"  {'window start (UTC)':20} {'page':12} {'views':>7} {'avg ms':>8}")
    for row in top:
        print(
            f"  {row.window_start:%Y-%m-%d %H:%M}     {row.page:12} {row.views:>7} "
            f"{row.duration_ms / row.views:>8.0f}"
        )
    verdict = verify(engine, db, kafka, job=job, topic=topic, oracle=oracle)
    engine.dispose()
    seconds = time.monotonic() - started
    print(
        f"demo: messages={oracle.messages} batches={summary.batches} seconds={seconds:.1f} verified={verdict}"
    )
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
