"""Two jobs through PgBouncer on local Spark with more task slots than the pool has server
connections (test_pgbouncer_concurrency.py runs this in its own process):

    python -m tests.integration.store.pgbouncer_job --schema S --job J --partition-topic T1 --batch-topic T2

The database URL comes from TXN_OFFSETS_DATABASE_URL (the pooled one), never the command line.
A PartitionWriter job counts keys of T1 into S.counts_p (each range's transaction holds 0.2 s, so
the tasks' transactions overlap), then a BatchWriter job counts keys of T2 into S.counts_b through
upsert_add's COPY path (>= COPY_MIN_ROWS rows per write). Prints one JSON line: the summaries and
the BatchWriter's write sizes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.session import local_session
from txn_offsets.spark.writers import BatchWriter, PartitionWriter
from txn_offsets.upserts import COPY_MIN_ROWS, upsert_add

HOLD_S = 0.2  # each PartitionWriter transaction stays open this long after its write


def table(schema: str, name: str) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("k", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        schema=schema,
    )


def key_of(record: Record) -> str:
    assert record.key is not None
    return record.key.decode()


class PartitionWrite:
    """upsert_add the range's counts, then keep the transaction open HOLD_S: four tasks' range
    transactions overlap, and only two of them can have a server connection at a time."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def __call__(self, conn: sa.Connection, rng: OffsetRange, agg: collections.Counter[str]) -> None:
        counts = table(self.schema, "counts_p")
        upsert_add(conn, counts, [{"k": k, "n": n} for k, n in agg.items()], keys=["k"], add=["n"])
        conn.execute(sa.text("SELECT pg_sleep(:s)"), {"s": HOLD_S})


def batch_counts(batch: Any) -> list[tuple[str, int]]:
    rows = batch.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
    return [(str(r.k), int(r["count"])) for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--schema", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--partition-topic", required=True)
    p.add_argument("--batch-topic", required=True)
    p.add_argument("--master", default="local[4]")
    args = p.parse_args(argv)
    db = DatabaseSettings(Secret(os.environ["TXN_OFFSETS_DATABASE_URL"]), schema=args.schema)
    kafka = KafkaSettings(os.environ["TXN_OFFSETS_KAFKA_BOOTSTRAP"])
    started = time.monotonic()
    spark = local_session("pgbouncer-concurrency", master=args.master)
    seconds = {"spark": 0.0, "partition": 0.0, "batch": 0.0}
    seconds["spark"] = time.monotonic() - started
    sizes: list[int] = []

    def write_batch(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]) -> None:
        sizes.append(len(rows))
        counts = table(args.schema, "counts_b")
        upsert_add(conn, counts, [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])

    try:
        common: dict[str, Any] = {"kafka": kafka, "database": db, "start": StartPolicy.earliest()}
        partition = run_job(
            spark,
            job=f"{args.job}-p",
            writer=PartitionWriter(
                write=PartitionWrite(args.schema), decode=key_of, aggregate=collections.Counter
            ),
            topics=[args.partition_topic],
            limits=Limits(max_records_per_partition=250),
            until_caught_up=True,
            **common,
        )
        seconds["partition"] = time.monotonic() - started - seconds["spark"]
        batch = run_job(
            spark,
            job=f"{args.job}-b",
            writer=BatchWriter(compute_df=batch_counts, write=write_batch),
            topics=[args.batch_topic],
            limits=Limits(max_records_per_batch=1500),
            until_caught_up=True,
            **common,
        )
        seconds["batch"] = time.monotonic() - started - seconds["spark"] - seconds["partition"]
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "partition": {"records": partition.records, "batches": partition.batches},
                "batch": {"records": batch.records, "batches": batch.batches, "sizes": sizes},
                "copy_min_rows": COPY_MIN_ROWS,
                "seconds": {k: round(v, 1) for k, v in seconds.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
