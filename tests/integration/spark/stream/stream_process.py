"""The processes of the streaming kill -9 tests (each in its own process: a kill must not take the
test down with it).

usage:
  python -m tests.integration.spark.stream.stream_process serve URL_FILE
      a classic local Spark driver that serves Spark Connect; writes the server's URL (it holds
      the server's token) to URL_FILE (mode 0600) and runs until killed
  python -m tests.integration.spark.stream.stream_process client URL_FILE JOB TOPIC SCHEMA TABLE CHECKPOINTS
      a Spark Connect client: opens the job's stream (force: fences whatever run held it), runs it
      until the stored offsets reach the topic's end, exits 0
(database and Kafka settings come from the environment, like every job)
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from tests.integration.spark.counting import counts_table_of, key_counts
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, from_env
from txn_offsets.kafka.metadata import partitions_for
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.store.database import engine_for
from txn_offsets.store.offset_rows import load_offsets
from txn_offsets.upserts import upsert_add

#: the write holds its transaction open this long, so a kill lands inside a batch's transaction
SLOW_WRITE = "SELECT pg_sleep(0.25) AS txn_offsets_stream_test"


def slow_write(
    table: str, conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]
) -> None:
    upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])
    conn.execute(sa.text(SLOW_WRITE))


def serve(url_file: str) -> int:
    from txn_offsets.spark.session import connect_url, local_session

    repo = str(Path(__file__).resolve().parents[4])
    spark = local_session(
        "txn-offsets-stream-server",
        master="local[2]",
        serve_connect=True,
        conf={"spark.executorEnv.PYTHONPATH": repo},
    )
    tmp = f"{url_file}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(connect_url(spark))
    os.replace(tmp, url_file)
    while True:
        signal.pause()


def client(url_file: str, job: str, topic: str, schema: str, table: str, checkpoints: str) -> int:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=schema)
    spark = ConnectSession.builder.remote(Path(url_file).read_text()).create()
    engine = engine_for(db)
    with open_stream(
        spark,
        job=job,
        kafka=kafka,
        database=db,
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=150),
        checkpoint_root=checkpoints,
        force=True,
        lease_s=10.0,
    ) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(slow_write, table), interval_s=0.2
        )
        ends = settled_ends(kafka, topic, partitions_for(kafka, topic))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if load_offsets(conn, db, job) == ends:
                    return 0
            if not query.isActive:
                print(f"query ended: {query.exception()}", file=sys.stderr)
                return 2
            time.sleep(0.3)
    return 3


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    sys.exit(serve(*args) if command == "serve" else client(*args))
