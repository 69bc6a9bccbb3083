"""Moving a job off Structured Streaming without losing or repeating a record.

A real Structured Streaming query (Spark's JVM Kafka source, spark-sql-kafka from Maven Central via
txn_offsets.devstack.spark_kafka) counts the first part of a topic into one table and stops. More
records arrive. `txn-offsets offsets import --from-spark-checkpoint` takes the query's position,
and a txn_offsets job continues from there into a second table. The two tables together equal the
oracle of everything produced: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.fix_services import REPO, TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets import cli
from txn_offsets.admin.checkpoint import read_checkpoint
from txn_offsets.config import DatabaseSettings, KafkaSettings


def test_structured_streaming_checkpoint_import_continues_exactly(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    database_url: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    parts = 3
    topic = topic_factory(partitions=parts)
    first = produce(topic, 3_000, parts)
    sss_table = f'"{db.schema}".counts_sss'
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {sss_table} (k text PRIMARY KEY, n bigint NOT NULL)"))

    checkpoint = tmp_path / "sss-checkpoint"
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.spark.stream.sss_query",
            kafka_bootstrap,
            topic,
            str(checkpoint),
            sss_table,
            "700",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip().splitlines()[-1].removeprefix("batches=")) >= 2  # several micro-batches
    assert totals(engine, sss_table) == dict(first)
    position = read_checkpoint(checkpoint)
    ends = settled_ends(kafka, topic, parts)
    assert dict(position.offsets) == ends  # Spark's END offsets of its last committed batch

    # more records arrive after the query stopped; then the import, and the job continues
    second = produce(topic, 2_000, parts, start=3_000)
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", database_url)
    monkeypatch.setenv("TXN_OFFSETS_KAFKA_BOOTSTRAP", kafka_bootstrap)
    code = cli.main(
        [
            "offsets",
            "import",
            "--job",
            job_name,
            "--from-spark-checkpoint",
            str(checkpoint),
            "--schema",
            db.schema,
        ]
    )
    assert code == 0
    assert stored_offsets(engine, db, job_name) == ends

    # no start policy: every partition has an imported offset
    summary = run_test_job(counting_writer(counts_table), [topic], start=None)
    assert summary.records == 2_000
    assert totals(engine, counts_table) == dict(second)
    union = collections.Counter(totals(engine, sss_table)) + collections.Counter(totals(engine, counts_table))
    assert union == first + second
    assert sum(union.values()) == 5_000
