"""A following job (``--follow``) stops cleanly between batches on SIGTERM, with its results and
offsets in agreement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import sqlalchemy as sa

from examples import pageviews
from examples.schema import window_counts
from tests.fix_services import REPO, Services, TopicFactory
from tests.integration.spark.counting import stored_offsets
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings


def test_sigterm_stops_between_batches(
    services: Services,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=2)
    oracle = pageviews.produce(kafka.bootstrap_servers, topic, 3_000, partitions=2, per_transaction=500)
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": services.database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "TXN_OFFSETS_SCHEMA": db.schema,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.windowed_counts",
            "--topic",
            topic,
            "--job",
            job_name,
            "--follow",
            "--batch-interval",
            "0.5",
            "--max-per-partition",
            "500",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ends = settled_ends(kafka, topic, 2)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if stored_offsets(engine, db, job_name) == ends:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert stored_offsets(engine, db, job_name) == ends, "the job never caught up"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "received SIGTERM: stopping after the current batch" in err
    assert f"windowed_counts: records={oracle.messages}" in out
    with engine.connect() as conn:
        views = conn.execute(
            sa.select(sa.func.sum(window_counts.c.views)).where(window_counts.c.topic == topic)
        ).scalar_one()
    assert views == oracle.messages
    with engine.connect() as conn:
        lease = conn.execute(
            sa.text(f'SELECT run_id FROM "{db.schema}".jobs WHERE job = :j'), {"j": job_name}
        ).scalar_one()
    assert lease is None  # the run released its lease on the way out
