"""A job run with the consumer-group mirror: after the run the group's offsets in Kafka equal the
offsets table (also when a newer run fenced an older one), and the run's batch statistics are in
job_stats for `txn-offsets serve`."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.planner import Limits
from txn_offsets.store.schema import tables_for


def test_mirror_group_equals_the_table_after_a_run(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=3)
    expected = produce(topic, 3_000, 3)
    group = f"{job_name}-mirror"
    summary = run_test_job(
        counting_writer(counts_table),
        [topic],
        limits=Limits(max_records_per_partition=400),
        mirror_group=group,
    )
    assert summary.batches >= 3
    assert totals(engine, counts_table) == dict(expected)
    assert group_offsets(kafka, group) == stored_offsets(engine, db, job_name)


def test_a_fenced_run_leaves_the_newer_runs_offsets_in_the_group(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    kafka_admin: AdminClient,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    """Run A commits its first batch; then run B of the same job and mirror group starts (fencing A),
    catches up and mirrors the end; A's next batch is fenced. The group must still say B's end."""
    topic = topic_factory(partitions=3)
    expected = produce(topic, 1_500, 3)
    group = f"{job_name}-mirror"

    def run(batch: int | None = 200, **kw: Any) -> Any:
        limits = Limits(max_records_per_partition=batch)
        return run_test_job(counting_writer(counts_table), [topic], limits=limits, mirror_group=group, **kw)

    newer: list[Any] = []

    def start_newer_run(report: object) -> None:
        if not newer:
            newer.append(run(None, force=True))

    with pytest.raises(Fenced):
        run(on_batch=start_newer_run)
    assert newer and newer[0].generation == 2
    assert totals(engine, counts_table) == dict(expected)
    stored = stored_offsets(engine, db, job_name)
    assert stored == {(topic, p): 500 for p in range(3)}
    assert group_offsets(kafka, group) == stored  # not A's 200s
    listed = kafka_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {tp.metadata for tp in listed.topic_partitions} == {"txn_offsets:v1:g=2"}


def test_runner_records_batch_statistics(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=2)
    produce(topic, 1_000, 2)
    summary = run_test_job(
        counting_writer(counts_table), [topic], limits=Limits(max_records_per_partition=200)
    )
    t = tables_for(db.schema).stats
    with engine.connect() as conn:
        row = conn.execute(sa.select(t).where(t.c.job == job_name)).one()
    assert row.batches == summary.batches and sum(row.batch_buckets) == summary.batches
    assert row.committed == summary.committed and row.already_committed == summary.already_committed
