"""A misconfigured run fails before it changes anything - not even the job's generation."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.counting import Counting, counting_writer
from txn_offsets import ConfigError, SchemaMissing, StartPolicy, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.planner import Limits, TopicSelection, preflight
from txn_offsets.store.handle import Store


def _jobs(engine: sa.Engine, db: DatabaseSettings) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f'SELECT job, generation FROM "{db.schema}".jobs'))]


def _run(spark: Any, counting: Counting, topic: str) -> None:
    run_job(
        spark,
        job=counting.job,
        kafka=counting.kafka,
        database=counting.db,
        writer=counting.writer(),
        topics=[topic],
        start=StartPolicy.earliest(),
    )


def test_missing_topic_changes_nothing(spark: Any, counting: Counting) -> None:
    with pytest.raises(ConfigError, match=r"topic 'no-such-topic-.*' does not exist"):
        _run(spark, counting, f"no-such-topic-{counting.job}")
    assert _jobs(counting.engine, counting.db) == []


def test_missing_schema_changes_nothing(
    spark: Any,
    engine: sa.Engine,
    database_url: str,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
    pg_schema: str,
) -> None:
    db = DatabaseSettings(database_url, schema=pg_schema)  # never migrated
    with pytest.raises(SchemaMissing, match="txn-offsets db upgrade"):
        run_job(
            spark,
            job=job_name,
            kafka=kafka,
            database=db,
            writer=counting_writer("x.counts"),
            topics=[topic_factory()],
            start=StartPolicy.earliest(),
        )
    with engine.connect() as conn:
        assert not conn.execute(
            sa.text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": pg_schema}
        ).all()


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"limits": lambda: Limits(max_records_per_partition=0)}, "max_records_per_partition"),
        ({"limits": lambda: Limits(max_records_per_batch=-5)}, "max_records_per_batch"),
        ({"batch_interval_s": -1}, "batch_interval_s"),
        ({"max_batches": 0}, "max_batches"),
        ({"on_data_loss": "ignore"}, "on_data_loss"),
        ({"job": ""}, "job"),
    ],
)
def test_bad_limits_are_named(spark: Any, counting: Counting, kwargs: dict[str, Any], setting: str) -> None:
    args: dict[str, Any] = {
        "job": counting.job,
        "kafka": counting.kafka,
        "database": counting.db,
        "writer": counting.writer(),
        "topics": [counting.topic_factory()],
        "start": StartPolicy.earliest(),
        "until_caught_up": True,
    }
    with pytest.raises(ConfigError, match=setting):
        given = {k: (v() if callable(v) else v) for k, v in kwargs.items()}  # Limits validates on creation
        run_job(spark, **{**args, **given})
    assert _jobs(counting.engine, counting.db) == []


@pytest.mark.parametrize("table", ["offsets", "offset_audit", "dead_letters"])
def test_a_missing_table_changes_nothing(spark: Any, counting: Counting, table: str) -> None:
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{counting.db.schema}".{table} CASCADE'))
    with pytest.raises(SchemaMissing, match=rf"{table}.*txn-offsets db upgrade"):
        _run(spark, counting, counting.topic_factory())
    assert _jobs(counting.engine, counting.db) == []


def test_the_preflight_reads_every_table_in_one_statement(counting_no_spark: Counting) -> None:
    """Every run's start: one round trip for the tables (four until 2026-11-30)."""
    store = Store.of(counting_no_spark.db)
    sent: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    try:
        with store.connect():  # the engine's first connection (its own checks) before counting
            pass
        sent.clear()
        preflight(
            store,
            counting_no_spark.kafka,
            job=counting_no_spark.job,
            selection=TopicSelection((counting_no_spark.topic_factory(),), None),
        )
    finally:
        store.engine.dispose()
    assert len(sent) == 1, sent
    for table in ("offsets", "jobs", "offset_audit", "dead_letters"):
        assert f"{counting_no_spark.db.schema}.{table}" in sent[0]
