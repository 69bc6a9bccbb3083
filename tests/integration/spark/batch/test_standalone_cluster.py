"""The counting job on a Spark standalone cluster (a master and two workers on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fix_services import Services, run_module
from tests.integration.spark.counting import Counting
from txn_offsets.devstack.cluster import StandaloneCluster


def test_counting_job_on_two_workers(counting_no_spark: Counting, tmp_path: Path, services: Services) -> None:
    topic, expected = counting_no_spark.topic(8, 20_000)
    args = (counting_no_spark.job, topic, counting_no_spark.db.schema, counting_no_spark.table)
    with StandaloneCluster(tmp_path / "spark", workers=2) as master:
        done = run_module(
            "tests.integration.spark.batch.standalone_job", master, *args, env=services.environ(), timeout=600
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["executors"] == 2
    assert result["records"] == 20_000
    assert counting_no_spark.totals() == dict(expected)
    assert counting_no_spark.offsets() == counting_no_spark.ends(topic, 8)
