"""A job run with the consumer-group mirror: after the run the group's offsets in Kafka equal the
offsets table (also when a newer run fenced an older one), and the run's batch statistics are in
job_stats for `txn-offsets serve`."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.integration.spark.counting import Counting
from txn_offsets.errors import Fenced
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.plan.planner import Limits
from txn_offsets.store.schema import tables_for


def test_mirror_group_equals_the_table_after_a_run(counting: Counting) -> None:
    topic, expected = counting.topic(3, 3_000)
    group = f"{counting.job}-mirror"
    summary = counting.run(
        topic,
        limits=Limits(max_records_per_partition=400),
        mirror_group=group,
    )
    assert summary.batches >= 3
    assert counting.totals() == dict(expected)
    assert group_offsets(counting.kafka, group) == counting.offsets()


def test_a_fenced_run_leaves_the_newer_runs_offsets_in_the_group(
    counting: Counting, kafka_admin: AdminClient
) -> None:
    """Run A commits its first batch; then run B of the same job and mirror group starts (fencing A),
    catches up and mirrors the end; A's next batch is fenced. The group must still say B's end."""
    topic, expected = counting.topic(3, 1_500)
    group = f"{counting.job}-mirror"

    def run(batch: int | None = 200, **kw: Any) -> Any:
        limits = Limits(max_records_per_partition=batch)
        return counting.run(topic, limits=limits, mirror_group=group, **kw)

    newer: list[Any] = []

    def start_newer_run(report: object) -> None:
        if not newer:
            newer.append(run(None, force=True))

    with pytest.raises(Fenced):
        run(on_batch=start_newer_run)
    assert newer and newer[0].generation == 2
    assert counting.totals() == dict(expected)
    stored = counting.offsets()
    assert stored == {(topic, p): 500 for p in range(3)}
    assert group_offsets(counting.kafka, group) == stored  # not A's 200s
    listed = kafka_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {tp.metadata for tp in listed.topic_partitions} == {"txn_offsets:v1:g=2"}


def test_runner_records_batch_statistics(counting: Counting) -> None:
    topic, _ = counting.topic(2, 1_000)
    summary = counting.run(topic, limits=Limits(max_records_per_partition=200))
    t = tables_for(counting.db.schema).stats
    with counting.engine.connect() as conn:
        row = conn.execute(sa.select(t).where(t.c.job == counting.job)).one()
    assert row.batches == summary.batches and sum(row.batch_buckets) == summary.batches
    assert row.committed == summary.committed and row.already_committed == summary.already_committed
