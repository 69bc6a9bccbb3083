"""The counting job on a Spark standalone cluster (a master and two workers on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from tests.fix_services import REPO, Services, TopicFactory
from tests.integration.spark.batch.test_counting_job import stored_offsets, totals
from tests.integration.spark.conftest import Produce
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.devstack.cluster import StandaloneCluster


def test_counting_job_on_two_workers(
    tmp_path: Path,
    services: Services,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=8)
    expected = produce(topic, 20_000, 8)
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": services.database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "PYTHONPATH": str(REPO),
    }
    with StandaloneCluster(tmp_path / "spark", workers=2) as master:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.integration.spark.batch.standalone_job",
                master,
                job_name,
                topic,
                db.schema,
                counts_table,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["executors"] == 2
    assert result["records"] == 20_000
    assert totals(engine, counts_table) == dict(expected)
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 8)
