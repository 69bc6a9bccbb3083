"""The counting job in a process of its own, following its topic until killed (the crash restart
test: SIGKILL of this driver, then a restart at once).

usage: python -m tests.integration.spark.batch.crash_job JOB TOPIC SCHEMA TABLE LEASE_S
(database and Kafka settings come from the environment, like every job)
"""

from __future__ import annotations

import sys

from tests.integration.spark.counting import counting_writer
from txn_offsets.config import DatabaseSettings, from_env
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.session import local_session

PER_BATCH = 100  # records per partition and batch: a topic of thousands is many batches


def main(argv: list[str]) -> int:
    job, topic, schema, table, lease_s = argv
    db, kafka = from_env()
    spark = local_session("txn-offsets-crash-test", master="local[2]")
    run_job(
        spark,
        job=job,
        kafka=kafka,
        database=DatabaseSettings(db.url, schema=schema),
        writer=counting_writer(table),
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_partition=PER_BATCH),
        lease_s=float(lease_s),
        batch_interval_s=0.5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
