"""Plumbing shared by the example jobs: command-line options and the run call.

Every example reads TXN_OFFSETS_DATABASE_URL / TXN_OFFSETS_KAFKA_BOOTSTRAP from the environment
(``set -a; . .stack/env; set +a`` after ``make stack-up``, or docker-compose's environment).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from txn_offsets import Limits, StartPolicy, from_env, local_session, run_job
from txn_offsets.logs import configure_logging
from txn_offsets.spark.summary import BatchReport, JobSummary
from txn_offsets.spark.writers import Writer


def parser(description: str, default_job: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--topic", required=True, help="Kafka topic to read")
    p.add_argument("--job", default=default_job, help="job name (its offsets live in the offsets table)")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    p.add_argument("--start", default="earliest", help="first-run start: earliest | latest | timestamp:<ms>")
    p.add_argument("--max-per-partition", type=int, default=100_000, help="records per partition per batch")
    p.add_argument("--batch-interval", type=float, default=5.0, help="seconds between polls when idle")
    p.add_argument("--follow", action="store_true", help="keep running after catching up (stop: Ctrl-C)")
    return p


def run_example(
    args: argparse.Namespace,
    writer: Writer,
    on_batch: Callable[[BatchReport], None] | None = None,
    spark: Any = None,
) -> JobSummary:
    configure_logging()  # text, or JSON lines with TXN_OFFSETS_LOG_FORMAT=json
    db, kafka = from_env()
    session = spark or local_session(f"txn-offsets-{args.job}", master=args.master)
    try:
        return run_job(
            session,
            job=args.job,
            kafka=kafka,
            database=db,
            writer=writer,
            topics=[args.topic],
            start=StartPolicy.parse(args.start),
            limits=Limits(max_records_per_partition=args.max_per_partition),
            batch_interval_s=args.batch_interval,
            until_caught_up=not args.follow,
            on_batch=on_batch,
            # the examples show their lag in Kafka's tools: offsets mirrored to a group named after the job
            mirror_group=args.job,
        )
    finally:
        if spark is None:
            session.stop()
