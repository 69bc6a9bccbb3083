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
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.fix_services import run_module
from tests.integration.spark.counting import Counting
from txn_offsets import cli
from txn_offsets.admin.checkpoint import read_checkpoint


def test_structured_streaming_checkpoint_import_continues_exactly(
    counting: Counting, database_url: str, kafka_bootstrap: str, tmp_path: Path, monkeypatch: Any
) -> None:
    parts = 3
    topic, first = counting.topic(parts, 3_000)
    sss_table = f'"{counting.db.schema}".counts_sss'
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {sss_table} (k text PRIMARY KEY, n bigint NOT NULL)"))

    checkpoint = tmp_path / "sss-checkpoint"
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    args = (kafka_bootstrap, topic, str(checkpoint), sss_table, "700")
    done = run_module("tests.integration.spark.stream.sss_query", *args, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip().splitlines()[-1].removeprefix("batches=")) >= 2  # several micro-batches
    assert counting.totals(sss_table) == dict(first)
    position = read_checkpoint(checkpoint)
    ends = counting.ends(topic, parts)
    assert dict(position.offsets) == ends  # Spark's END offsets of its last committed batch

    # more records arrive after the query stopped; then the import, and the job continues
    second = counting.produce(topic, 2_000, parts, start=3_000)
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", database_url)
    monkeypatch.setenv("TXN_OFFSETS_KAFKA_BOOTSTRAP", kafka_bootstrap)
    code = cli.main(
        [
            "offsets",
            "import",
            "--job",
            counting.job,
            "--from-spark-checkpoint",
            str(checkpoint),
            "--schema",
            counting.db.schema,
        ]
    )
    assert code == 0
    assert counting.offsets() == ends

    # no start policy: every partition has an imported offset
    summary = counting.run(topic, start=None)
    assert summary.records == 2_000
    assert counting.totals() == dict(second)
    union = collections.Counter(counting.totals(sss_table)) + collections.Counter(counting.totals())
    assert union == first + second
    assert sum(union.values()) == 5_000
