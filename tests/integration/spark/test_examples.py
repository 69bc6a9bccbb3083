"""Every example job runs on small data and its results equal the oracle of what was produced."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from examples import idempotent_events, metric_per_topic, pageviews, top_keys_per_batch, windowed_counts
from examples.schema import events, top_keys, topic_metrics, window_counts
from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import stored_offsets
from tests.integration.spark.conftest import RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets import Limits
from txn_offsets.config import DatabaseSettings, KafkaSettings

N = 6_000


@pytest.fixture
def data(kafka: KafkaSettings, topic_factory: TopicFactory) -> tuple[str, pageviews.Oracle]:
    topic = topic_factory(partitions=4)
    oracle = pageviews.produce(kafka.bootstrap_servers, topic, N, partitions=4, per_transaction=500)
    return topic, oracle


def test_windowed_counts(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    data: tuple[str, pageviews.Oracle],
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic, oracle = data
    assert oracle.aborted > 0
    summary = run_test_job(windowed_counts.WRITER, [topic], limits=Limits(max_records_per_partition=1_000))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(window_counts).where(window_counts.c.topic == topic)).all()
    views = {(int(r.window_start.timestamp() * 1000), r.page): r.views for r in rows}
    durations = {(int(r.window_start.timestamp() * 1000), r.page): r.duration_ms for r in rows}
    assert views == dict(oracle.windows)
    assert durations == dict(oracle.durations)
    assert summary.records == N
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)


def test_metric_per_topic(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    data: tuple[str, pageviews.Oracle],
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic, oracle = data
    run_test_job(metric_per_topic.WRITER, [topic], limits=Limits(max_records_per_partition=1_000))
    with engine.connect() as conn:
        row = conn.execute(sa.select(topic_metrics).where(topic_metrics.c.topic == topic)).one()
    assert (row.records, row.bytes) == (N, oracle.value_bytes)


def test_top_keys_per_batch(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    data: tuple[str, pageviews.Oracle],
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic, oracle = data
    # one batch holding everything: its ranking must be the ranking of the whole data set
    summary = run_test_job(top_keys_per_batch.make_writer(job_name), [topic])
    assert summary.batches == 1
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(top_keys).where(top_keys.c.job == job_name).order_by(top_keys.c.rank)
        ).all()
    expected = sorted(oracle.per_user.items(), key=lambda kv: (-kv[1], kv[0]))[: top_keys_per_batch.TOP]
    assert [(r.key, r.n) for r in rows] == expected
    assert {r.records for r in rows} == {N}


def test_idempotent_events(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    examples_schema: None,
    data: tuple[str, pageviews.Oracle],
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic, oracle = data
    run_test_job(idempotent_events.WRITER, [topic], limits=Limits(max_records_per_partition=1_000))
    with engine.connect() as conn:
        count, users = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(events.c.key))).where(
                events.c.topic == topic
            )
        ).one()
    assert count == N
    assert users == len(oracle.per_user)
