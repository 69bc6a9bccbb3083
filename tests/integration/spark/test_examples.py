"""Every example job runs on small data and its results equal the oracle of what was produced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from examples import idempotent_events, metric_per_topic, pageviews, top_keys_per_batch, windowed_counts
from examples.schema import events, top_keys, topic_metrics, window_counts
from tests.fix_services import TopicFactory
from tests.integration.spark.conftest import RunTestJob
from tests.integration.spark.counting import stored_offsets
from tests.kafka_ends import settled_ends
from txn_offsets import JobSummary, Limits
from txn_offsets.config import DatabaseSettings, KafkaSettings

N = 6_000


@dataclass(frozen=True)
class Example:
    """An example job's test: a topic of N pageviews (4 partitions, transactions of 500, some
    aborted), their oracle, and this test's job over it."""

    topic: str
    oracle: pageviews.Oracle
    engine: sa.Engine
    db: DatabaseSettings
    kafka: KafkaSettings
    job: str
    runner: RunTestJob

    def run(self, writer: Any, **overrides: Any) -> JobSummary:
        return self.runner(writer, [self.topic], **overrides)

    def rows(self, statement: sa.Select[Any]) -> list[sa.Row[Any]]:
        with self.engine.connect() as conn:
            return list(conn.execute(statement).all())


@pytest.fixture
def example(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    topic_factory: TopicFactory,
    job_name: str,
    run_test_job: RunTestJob,
) -> Example:
    topic = topic_factory(partitions=4)
    oracle = pageviews.produce(kafka.bootstrap_servers, topic, N, partitions=4, per_transaction=500)
    return Example(topic, oracle, engine, db, kafka, job_name, run_test_job)


def test_windowed_counts(example: Example) -> None:
    topic, oracle = example.topic, example.oracle
    assert oracle.aborted > 0
    summary = example.run(windowed_counts.WRITER, limits=Limits(max_records_per_partition=1_000))
    rows = example.rows(sa.select(window_counts).where(window_counts.c.topic == topic))
    views = {(int(r.window_start.timestamp() * 1000), r.page): r.views for r in rows}
    durations = {(int(r.window_start.timestamp() * 1000), r.page): r.duration_ms for r in rows}
    assert views == dict(oracle.windows)
    assert durations == dict(oracle.durations)
    assert summary.records == N
    assert stored_offsets(example.engine, example.db, example.job) == settled_ends(example.kafka, topic, 4)


def test_metric_per_topic(example: Example) -> None:
    example.run(metric_per_topic.WRITER, limits=Limits(max_records_per_partition=1_000))
    (row,) = example.rows(sa.select(topic_metrics).where(topic_metrics.c.topic == example.topic))
    assert (row.records, row.bytes) == (N, example.oracle.value_bytes)


def test_top_keys_per_batch(example: Example) -> None:
    # one batch holding everything: its ranking must be the ranking of the whole data set
    summary = example.run(top_keys_per_batch.make_writer(example.job))
    assert summary.batches == 1
    rows = example.rows(sa.select(top_keys).where(top_keys.c.job == example.job).order_by(top_keys.c.rank))
    ranked = sorted(example.oracle.per_user.items(), key=lambda kv: (-kv[1], kv[0]))
    assert [(r.key, r.n) for r in rows] == ranked[: top_keys_per_batch.TOP]
    assert {r.records for r in rows} == {N}


def test_idempotent_events(example: Example) -> None:
    example.run(idempotent_events.WRITER, limits=Limits(max_records_per_partition=1_000))
    ((count, users),) = example.rows(
        sa.select(sa.func.count(), sa.func.count(sa.distinct(events.c.key))).where(
            events.c.topic == example.topic
        )
    )
    assert count == N
    assert users == len(example.oracle.per_user)
