"""The chaos job as a Structured Streaming query on the lab's cluster: ``open_stream`` + ``stream.start``.

``python -m chaos.scenarios.lab_stream`` takes ``chaos.job``'s flags and runs a micro-batch every
``--batch-interval`` until SIGTERM.

Run on the driver host like :mod:`chaos.scenarios.lab_job`, with the session settings of
``CHAOS_LAB_SPARK``, but the job environment :data:`ARCHIVE` (txn_offsets' requirements and pyarrow:
the ``txn_offsets`` source is a Python data source, whose readers exchange Arrow batches). Spark
plans a Python data source in a Python worker the *driver* starts, with the executors' interpreter
``./env/bin/python`` resolved against the driver's working directory: the job therefore runs in its
run directory with the same archive unpacked at ``./env`` (what a client-mode driver of such a job
needs beside its spark-submit ``--archives``).

Each micro-batch's result, computed on the cluster (``compute_df``), is the page views per (topic,
user) and the records per partition; its write adds the first to ``chaos_counts`` and logs each
committed range in ``chaos_applied`` (:func:`chaos.faults.tables`), in the transaction that commits
the batch's ranges: the run is checked like the batch job's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chaos import job
from chaos.faults import tables
from chaos.procs import REPO
from chaos.scenarios.lab_job import VARIABLE
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.upserts import upsert_add

__all__ = ["ARCHIVE", "main"]

#: the stream's job environment: ``make chaos-lab`` builds it (jobenv --with pyarrow)
ARCHIVE = REPO / "dist" / "job-env-stream.tar.gz"

Result = tuple[list[tuple[str, str, int]], dict[tuple[str, int], int]]


def results(batch: Any) -> Result:
    """compute_df: the micro-batch's page views per (topic, user) and records per partition."""
    users = batch.selectExpr("topic", "get_json_object(CAST(value AS STRING), '$.u') AS k")
    counts = [(r.topic, r.k, int(r["count"])) for r in users.groupBy("topic", "k").count().collect()]
    parts = batch.groupBy("topic", "partition").count().collect()
    return counts, {(r.topic, int(r.partition)): int(r["count"]) for r in parts}


def writer(schema: str) -> Any:
    t = tables(schema)

    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], result: Result) -> None:
        counts, records = result
        rows = [{"topic": topic, "k": k, "n": n} for topic, k, n in counts]
        upsert_add(conn, t.counts, rows, keys=["topic", "k"], add=["n"])
        for rng in ranges:
            n = records.get((rng.topic, rng.partition), 0)
            conn.execute(
                sa.insert(t.applied).values(
                    topic=rng.topic, part=rng.partition, start_off=rng.start, until_off=rng.until, records=n
                )
            )

    return write


def _unpacked(archive: Path, where: Path) -> None:
    """`archive` at ``where/env`` (once), for the driver-side Python worker of the source."""
    env = where / "env"
    if not (env / "bin" / "python").exists():
        env.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(env, filter="tar")


def main(argv: list[str] | None = None) -> int:
    args = job.parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if VARIABLE not in os.environ or not args.run_dir:
        print(f"chaos-job: ConfigError: {VARIABLE} or --run-dir is not set (run by python -m chaos --lab)",
              file=sys.stderr)  # fmt: skip
        return 2
    if not ARCHIVE.is_file():
        print(f"chaos-job: ConfigError: {ARCHIVE} is missing: run `make chaos-lab`", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir).resolve()
    _unpacked(ARCHIVE, run_dir)
    os.chdir(run_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from pyspark.sql import SparkSession

    settings = json.loads(os.environ[VARIABLE]) | {"spark.archives": f"{ARCHIVE}#env"}
    os.environ["PYSPARK_PYTHON"] = "./env/bin/python"
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName(f"chaos-{args.job}")
    for key, value in {**settings, "spark.task.maxFailures": "3"}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    url = os.environ.get(args.database_url_env, "")
    db = DatabaseSettings(Secret(url), schema=args.schema)
    named = db.url.update_query_dict({"application_name": args.app_name}).render_as_string(False)
    db = DatabaseSettings(Secret(named), schema=args.schema, connect_timeout_s=5.0)
    options: dict[str, Any] = {
        "kafka": KafkaSettings(args.kafka_bootstrap),
        "database": db,
        "topics": args.topics.split(","),
        "start": StartPolicy.earliest(),
        "limits": Limits(max_records_per_partition=args.max_per_partition),
        "checkpoint_root": str(run_dir / "checkpoints"),
        "lease_s": args.lease_s,
    }
    try:
        with open_stream(spark, job=args.job, **options) as stream:
            records = spark.readStream.format("txn_offsets").option("job", args.job).load()
            query = stream.start(records, compute_df=results, write=writer(args.schema),
                                 interval_s=args.batch_interval)  # fmt: skip
            while query.isActive and not stop.is_set():
                query.awaitTermination(1)
            failed = query.exception()
            query.stop()
            if failed is not None:
                print(f"chaos-job: StreamingQueryException: {failed}", file=sys.stderr)
                return 1
    except TxnOffsetsError as exc:
        print(f"chaos-job: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print("chaos-job: stream stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
