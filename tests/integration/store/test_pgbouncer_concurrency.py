"""Exactly once through PgBouncer with fewer server connections than concurrent tasks: local[4]
(four Spark task slots, four Python workers, each with its own connection) and the driver, on a
transaction pool of 2 server connections (the stack's PgBouncer, or one started for the session).

The jobs run in their own process (tests/integration/store/pgbouncer_job.py) so that they get four task
slots; the session's Spark fixture has two. PgBouncer's admin console (SHOW POOLS) is sampled
meanwhile: the proof that the pool was oversubscribed is clients WAITING for a server connection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import sqlalchemy as sa

from tests.fix_services import REPO, Services, TopicFactory
from tests.integration.spark.counting import produce_keyed, stored_offsets, totals
from tests.integration.store.pgbouncer_job import table
from tests.integration.store.test_pgbouncer import POOL_SIZE, PoolWatch
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import migrate


def test_partition_and_batch_writer_jobs_with_four_concurrent_tasks_on_a_pool_of_two(
    services: Services,
    pooled_database_url: str,
    database_url: str,
    kafka_bootstrap: str,
    engine: sa.Engine,
    pg_schema: str,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    db = DatabaseSettings(database_url, schema=pg_schema)
    migrate.upgrade(db)
    counts_p, counts_b = table(pg_schema, "counts_p"), table(pg_schema, "counts_b")
    with engine.begin() as conn:
        counts_p.create(conn)
        counts_b.create(conn)
    t_partition, t_batch = topic_factory(partitions=8), topic_factory(partitions=4)
    expected_p = produce_keyed(kafka_bootstrap, t_partition, 4000, 8, keys=97)  # 2 batches of 8 ranges
    expected_b = produce_keyed(kafka_bootstrap, t_batch, 3000, 4, keys=997)  # 2 batches, >= 500 rows each
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": pooled_database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [
        sys.executable, "-m", "tests.integration.store.pgbouncer_job",
        "--schema", pg_schema, "--job", job_name, "--partition-topic", t_partition,
        "--batch-topic", t_batch, "--master", "local[4]",
    ]  # fmt: skip
    with PoolWatch(services, pooled_database_url) as watch:
        done = subprocess.run(
            cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
        )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report["seconds"], "clients", watch.clients, "servers", watch.servers, "waiting", watch.waiting)
    assert report["partition"] == {"records": 4000, "batches": 2}
    assert report["batch"]["batches"] == 2
    assert min(report["batch"]["sizes"]) >= report["copy_min_rows"], report  # the COPY path, twice
    # exact: every record counted once, every stored offset at Kafka's end
    assert totals(engine, counts_p) == dict(expected_p)
    assert totals(engine, counts_b) == dict(expected_b)
    assert stored_offsets(engine, db, f"{job_name}-p") == settled_ends(kafka_bootstrap, t_partition, 8)
    assert stored_offsets(engine, db, f"{job_name}-b") == settled_ends(kafka_bootstrap, t_batch, 4)
    # oversubscribed: at least 4 clients at once on at most 2 server connections, some of them waiting
    assert watch.servers <= POOL_SIZE and watch.clients >= 4 and watch.waiting > 0, (
        watch.servers,
        watch.clients,
        watch.waiting,
    )
    assert str(sa.engine.make_url(pooled_database_url).password) not in done.stdout + done.stderr
