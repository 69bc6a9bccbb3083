"""Run the counting job against a Spark master given on the command line (used by the standalone
cluster test, in its own process because a process holds one SparkContext).

usage: python -m tests.integration.spark.batch.standalone_job MASTER_URL JOB TOPIC SCHEMA TABLE
(database and Kafka settings come from the environment, like every job)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.integration.spark.counting import counting_writer
from txn_offsets.config import DatabaseSettings, from_env
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.session import local_session


def main(argv: list[str]) -> int:
    master, job, topic, schema, table = argv
    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=schema)
    repo = str(Path(__file__).resolve().parents[4])
    spark = local_session(
        "txn-offsets-standalone-test",
        master=master,
        conf={"spark.executor.memory": "512m", "spark.cores.max": "2", "spark.executorEnv.PYTHONPATH": repo},
    )
    try:
        summary = run_job(
            spark,
            job=job,
            kafka=kafka,
            database=db,
            writer=counting_writer(table),
            topics=[topic],
            start=StartPolicy.earliest(),
            limits=Limits(max_records_per_partition=2_000),
            until_caught_up=True,
        )
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    finally:
        spark.stop()
    print(json.dumps({"records": summary.records, "batches": summary.batches, "executors": executors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
